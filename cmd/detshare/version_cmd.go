package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/version"
	"github.com/detshare/detshare/internal/table"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the DetShare version, the table ABI version and the Go toolchain",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "detshare %s\ntable ABI %d\n%s %s/%s\n", version.Version, table.ABIVersion,
				runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
