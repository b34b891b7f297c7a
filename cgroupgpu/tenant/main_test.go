package tenant

import (
	"context"
	"os"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/simgpu"
)

func TestMain(m *testing.M) {
	// Registration logs at info; keep test output to failures (DETSHARE_LOG_LEVEL=debug to see them).
	lvl, err := logrus.ParseLevel(os.Getenv("DETSHARE_LOG_LEVEL"))
	if err != nil {
		lvl = logrus.WarnLevel
	}
	logrus.SetLevel(lvl)
	os.Exit(m.Run())
}

// Register registers as the NVML-free binaries do when their environment selects the simulated GPU (the test double
// discovers the GPUs; no scheduler is started; gpu=auto is placed first-fit).
func Register(ctx context.Context, runDir string, req Request) (Result, error) {
	return (&Registrar{DiscoverGPUs: simgpu.Discover}).Register(ctx, runDir, req)
}
