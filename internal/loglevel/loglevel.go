// Package loglevel applies the log level every DetShare binary takes on its command line (--log-level or
// DETSHARE_LOG_LEVEL), with one message naming the allowed values.
package loglevel

import (
	"fmt"
	"os"

	"github.com/sirupsen/logrus"
)

// Allowed lists the levels, for flag usage and errors.
const Allowed = "panic, fatal, error, warning, info, debug, trace"

// Set makes level logrus's level, logging to stderr; flag names the setting in the error.
func Set(flag, level string) error {
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("%s %q: allowed values are %s", flag, level, Allowed)
	}
	logrus.SetLevel(lvl)
	logrus.SetOutput(os.Stderr)
	if lvl >= logrus.DebugLevel {
		// Debug lines (grant decisions, gate changes) are microseconds apart; second stamps cannot be lined up with
		// a tenant's request times.
		logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "2006-01-02T15:04:05.000000Z07:00"})
	}
	return nil
}
