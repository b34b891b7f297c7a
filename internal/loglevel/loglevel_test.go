package loglevel

import (
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestSet(t *testing.T) {
	defer logrus.SetLevel(logrus.GetLevel())
	if err := Set("--log-level", "debug"); err != nil || logrus.GetLevel() != logrus.DebugLevel {
		t.Fatalf("debug: %v, level %v", err, logrus.GetLevel())
	}
	err := Set("--log-level", "loud")
	if err == nil || !strings.Contains(err.Error(), `--log-level "loud"`) || !strings.Contains(err.Error(), Allowed) {
		t.Fatalf("bad level: %v", err)
	}
	if logrus.GetLevel() != logrus.DebugLevel {
		t.Fatal("a bad level changed the level")
	}
}
