package table

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PageCarrierEnv names the descriptor of a page carrier a program inherits across exec (libdetshare reads it).
const PageCarrierEnv = "DETSHARE_CLIENT_PAGE_SOCK"

// NewPageCarrier returns what carries a host tenant's client page across a privilege drop (issue 27): one end of a
// datagram socket pair holding a single queued message whose SCM_RIGHTS is a read-write descriptor of the page at
// path. The end is inherited across exec (no close-on-exec) and named in PageCarrierEnv; libdetshare takes its own
// copy of the page with recvmsg(MSG_PEEK), which leaves the message queued for the next process, and does so only
// after PR_SET_DUMPABLE 0. Unlike the page itself, a socket cannot be reopened through /proc/<pid>/fd (ENXIO), so a
// process of the same user gets nothing from a tenant program in the window between its exec and its constructor.
// The caller closes the returned file once the program has started; the page opened here is closed before return.
func NewPageCarrier(path string) (*os.File, error) {
	page, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("page carrier: %w", err)
	}
	defer page.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("page carrier: socketpair: %w", err)
	}
	defer unix.Close(fds[1])
	if err := unix.Sendmsg(fds[1], []byte{'p'}, unix.UnixRights(int(page.Fd())), nil, 0); err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("page carrier: queue the page: %w", err)
	}
	// os/exec clears close-on-exec on the descriptors it passes (ExtraFiles); the sending end is closed here, and
	// what it queued stays readable at the receiving end.
	return os.NewFile(uintptr(fds[0]), "detshare-page-carrier"), nil
}
