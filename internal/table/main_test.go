package table

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func TestMain(m *testing.M) {
	// Re-executed as a tenant's process: map the client page named here (as libdetshare does) and wait to be killed.
	if path := os.Getenv("DETSHARE_TEST_MAP_PAGE"); path != "" {
		cl, err := OpenClientPage(path)
		if err != nil {
			fmt.Println("map:", err)
			os.Exit(1)
		}
		_ = cl
		fmt.Println("mapped")
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	// Recovery and reaping log at info; keep test output to failures (DETSHARE_LOG_LEVEL=debug to see them).
	lvl, err := logrus.ParseLevel(os.Getenv("DETSHARE_LOG_LEVEL"))
	if err != nil {
		lvl = logrus.WarnLevel
	}
	logrus.SetLevel(lvl)
	os.Exit(m.Run())
}
