package nodecli

import (
	"context"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/k8s/deviceplugin"
)

// --xid-ignored and --xid-hold are checked before any watch starts: a value that is not an Xid and a negative hold are
// refused naming the flag and the allowed values.
func TestXidFlagsRefuseBadValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--xid-ignored", "13,x"}, []string{"--xid-ignored", "none or a comma-separated list of Xid numbers"}},
		{[]string{"--xid-hold", "-1s"}, []string{"--xid-hold=-1s", "0 (until the plugin restarts) or a positive duration"}},
	} {
		var err error
		app := &cli.App{Flags: Flags(), Action: func(c *cli.Context) error {
			_, err = XidHealth(context.Background(), c, func(context.Context, func(int, uint64)) error {
				t.Error("a watch started with bad flags")
				return nil
			}, deviceplugin.Inventory{})
			return nil
		}}
		if runErr := app.Run(append([]string{"plugin"}, tc.args...)); runErr != nil {
			t.Fatal(runErr)
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want an error containing %q", tc.args, err, w)
			}
		}
	}
}
