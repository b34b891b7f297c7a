// Package version holds the DetShare release string, stamped at link time by the Makefile.
package version

// Version is set with -ldflags "-X …/version.Version=…"; "dev" marks an unstamped build.
var Version = "dev"
