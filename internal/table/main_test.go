package table

import (
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestMain(m *testing.M) {
	// Recovery and reaping log at info; keep test output to failures (DETSHARE_LOG_LEVEL=debug to see them).
	lvl, err := logrus.ParseLevel(os.Getenv("DETSHARE_LOG_LEVEL"))
	if err != nil {
		lvl = logrus.WarnLevel
	}
	logrus.SetLevel(lvl)
	os.Exit(m.Run())
}
