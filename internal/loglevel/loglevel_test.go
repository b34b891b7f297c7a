package loglevel

import (
	"os"
	"regexp"
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

// At debug level every line carries microseconds, so grant decisions can be lined up with request times.
func TestDebugStampsMicroseconds(t *testing.T) {
	defer logrus.SetLevel(logrus.GetLevel())
	defer logrus.SetFormatter(logrus.StandardLogger().Formatter)
	if err := Set("--log-level", "debug"); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	logrus.SetOutput(&b)
	defer logrus.SetOutput(os.Stderr)
	logrus.Debug("grant")
	if !regexp.MustCompile(`time="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}`).MatchString(b.String()) {
		t.Fatalf("debug line without microseconds: %s", b.String())
	}
}
