package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/detshare/detshare/internal/config"
	"github.com/detshare/detshare/internal/simgpu"
	"github.com/detshare/detshare/internal/table"
	"github.com/detshare/detshare/sched/mps"
)

// The test binary doubles as the helper processes of the multi-process tests:
//
//	DETSHARE_DAEMON_TEST_ROLE=sched   a scheduler leading $DETSHARE_RUN_DIR (args may be "--run-dir DIR sched", as
//	                                  sched/ensure starts it)
//	DETSHARE_DAEMON_TEST_ROLE=client  a tenant process: attaches to client page $PAGE, charges $CHARGE bytes, marks
//	                                  itself busy, rings the doorbell, then sleeps until killed
//	DETSHARE_DAEMON_TEST_ROLE=owner   sleeps (the owner of a host tenant)
func TestMain(m *testing.M) {
	switch os.Getenv("DETSHARE_DAEMON_TEST_ROLE") {
	case "sched":
		os.Exit(helperSched())
	case "client":
		os.Exit(helperClient())
	case "owner":
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	if os.Getenv("DETSHARE_TEST_VERBOSE") == "" {
		logrus.SetLevel(logrus.ErrorLevel)
	}
	os.Exit(m.Run())
}

func helperSched() int {
	runDir := os.Getenv(table.RunDirEnv)
	for i, a := range os.Args {
		if a == "--run-dir" && i+1 < len(os.Args) {
			runDir = os.Args[i+1]
		}
	}
	cfg := config.Default()
	cfg.MPS.Enable = os.Getenv("TEST_MPS") == "1"
	cfg.Scheduler.ReapEvery = config.Duration{Duration: 50 * time.Millisecond}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	// Wired as `detshare sched` is (cmd/detshare/sched.go), minus discovery: the tests record the GPUs.
	err := Main(ctx, Options{RunDir: runDir, Config: cfg, StopMPSOnExit: os.Getenv("TEST_STOP_MPS") == "1",
		SimulatedGPU: simgpu.Selected(os.Environ())}, os.Getenv("TEST_CONFIG"), hup)
	if err == ErrNotLeader {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper scheduler:", err)
		return 1
	}
	return 0
}

func helperClient() int {
	cl, err := table.OpenClientPage(os.Getenv("PAGE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	id, err := table.SelfIdentity()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	id.HostPID = uint64(os.Getpid())
	i, err := cl.AttachProcess(id)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if n, _ := strconv.ParseUint(os.Getenv("CHARGE"), 10, 64); n > 0 {
		cl.ChargeMemory(i, n, 0)
	}
	if cl.SetBusy(i, true) {
		if t, err := table.OpenReadOnly(os.Getenv(table.RunDirEnv)); err == nil {
			t.RingDoorbell()
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
	return 0
}

func simMPS(dir string) *mps.Manager {
	return &mps.Manager{Paths: table.NewPaths(dir), Simulated: true}
}

func ctxFromChan(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
