// Package shimv2 is the serving shim of containerd-shim-detshare-v1 (binary containerd-shim-detshare-v1-serve, which
// the front, package shimv2/front, starts): containerd's runc task service (containerd v1.7 libraries, so the
// shim runs under containerd 1.6, 1.7 and, through the v2 bridge, 2.x) wrapped so that Create registers the
// container with DetShare and edits its spec (package hook) before runc sees it, Delete deregisters it, and the
// runtime options CRI and Docker send to non-runc runtimes are normalised.
package shimv2

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/runtime/v2/runc/task"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/quota"
	"github.com/detshare/detshare/cgroupgpu/tenant"
	"github.com/detshare/detshare/hook"
	"github.com/detshare/detshare/hook/specmod"
)

// RuntimeName is the containerd runtime type of the shim (binary containerd-shim-detshare-v1).
const RuntimeName = "io.containerd.detshare.v1"

// EnvLabels set to 0 turns off reading containerd container labels (`ctr run --label detshare.io/…`): one
// round trip to containerd less per container start, for hosts that use only annotations and env.
const EnvLabels = "DETSHARE_SHIM_LABELS"

// SandboxTypeAnnotation is set by CRI on every container; "sandbox" marks the pod's pause container.
const SandboxTypeAnnotation = quota.CRIContainerType

// RegisterPlugin registers the DetShare task service as the shim's ttrpc "task" plugin, registering containers with
// reg and giving them their GPU with the source devices returns for the hook's path. The shim's main calls it
// once, before shim.RunManager (containerd's plugin registry is process-global).
func RegisterPlugin(reg tenant.Registrar, devices func(hookPath string) cdi.Source) {
	plugin.Register(&plugin.Registration{
		Type:     plugin.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugin.EventPlugin, plugin.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pp, err := ic.GetByID(plugin.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugin.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			inner, err := task.NewTaskService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service))
			if err != nil {
				return nil, err
			}
			ns, _ := namespaces.Namespace(ic.Context)
			var labels LabelFunc
			if os.Getenv(EnvLabels) != "0" {
				labels = ContainerdLabels(ic.Address, ns)
			}
			cfg := hook.ConfigFromEnv(reg)
			if devices != nil {
				cfg.Devices = devices(cfg.HookPath)
			}
			s := New(inner, cfg, labels)
			// Outside CRI (its namespace; CRI containers carry annotations and are never looked up) a shim serves
			// the one container whose ID it was started with: read its labels while containerd is still on its
			// way to Create. main started that lookup already (PrefetchAtStart) unless labels are off.
			if p := earlyPrefetch.Load(); p != nil && labels != nil {
				s.mu.Lock()
				s.prefetch = p
				s.mu.Unlock()
			} else if f := flag.Lookup("id"); f != nil && ns != CRINamespace {
				s.PrefetchLabels(f.Value.String())
			}
			return s, nil
		},
	})
}

// CRINamespace is the containerd namespace of containerd's CRI plugin (Kubernetes).
const CRINamespace = "k8s.io"

// LabelFunc returns a container's engine labels.
type LabelFunc func(ctx context.Context, id string) (map[string]string, error)

// Service is the DetShare task service: the runc one with Create, Delete and Shutdown wrapped.
type Service struct {
	taskAPI.TaskService
	cfg    hook.Config
	labels LabelFunc

	mu         sync.Mutex
	registered map[string]bool
	prefetch   *labelPrefetch
}

// labelPrefetch is one container's label lookup started ahead of its Create.
type labelPrefetch struct {
	id     string
	done   chan struct{}
	labels map[string]string
	err    error
}

// LabelPrefetchTimeout bounds a prefetched label lookup (as Create's own lookup is bounded).
const LabelPrefetchTimeout = 3 * time.Second

// PrefetchLabels starts reading container id's labels now, so that its Create finds them read: the lookup is a new
// connection to containerd's gRPC socket and a round trip (ContainerdLabels), up to ~15 ms of a loaded machine's
// start (issue 28), which otherwise the container's start waits for. Create uses the result only for that ID; a failed prefetch is
// looked up again there.
func (s *Service) PrefetchLabels(id string) {
	if s.labels == nil || id == "" {
		return
	}
	p := startPrefetch(s.labels, id)
	s.mu.Lock()
	s.prefetch = p
	s.mu.Unlock()
}

// earlyPrefetch is the label lookup PrefetchAtStart started (nil: none).
var earlyPrefetch atomic.Pointer[labelPrefetch]

// PrefetchAtStart starts the label lookup of the container a long-lived shim is started for, from the shim's
// command line (args without the program name), before containerd's shim library sets the shim up: the ~5 ms of
// that setup then overlap the lookup (issue 28). It does nothing for the binary's start and delete actions, in
// CRI's namespace, without an ID or address, or with DETSHARE_SHIM_LABELS=0. The task service adopts the lookup
// (RegisterPlugin); Create uses it only for that ID.
func PrefetchAtStart(args []string) {
	fs := flag.NewFlagSet("shim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("debug", false, "")
	version := fs.Bool("v", false, "")
	ns := fs.String("namespace", "", "")
	id := fs.String("id", "", "")
	fs.String("socket", "", "")
	fs.String("bundle", "", "")
	address := fs.String("address", "", "")
	fs.String("publish-binary", "", "")
	if fs.Parse(args) != nil || fs.NArg() > 0 || *version || *id == "" || *address == "" || *ns == "" ||
		*ns == CRINamespace || os.Getenv(EnvLabels) == "0" {
		return
	}
	earlyPrefetch.Store(startPrefetch(ContainerdLabels(*address, *ns), *id))
}

// startPrefetch starts looking up id's labels with labels.
func startPrefetch(labels LabelFunc, id string) *labelPrefetch {
	p := &labelPrefetch{id: id, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		ctx, cancel := context.WithTimeout(context.Background(), LabelPrefetchTimeout)
		defer cancel()
		t0 := time.Now()
		p.labels, p.err = labels(ctx, id)
		logrus.WithError(p.err).WithFields(logrus.Fields{"id": id,
			"ms": float64(time.Since(t0).Microseconds()) / 1000}).Debug("container labels prefetched")
	}()
	return p
}

// containerLabels returns container id's labels: the prefetched ones when they were read for id, else a lookup.
func (s *Service) containerLabels(ctx context.Context, id string) (map[string]string, error) {
	s.mu.Lock()
	p := s.prefetch
	if p != nil && p.id == id {
		s.prefetch = nil // once: a retried create of the same ID reads them again
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, LabelPrefetchTimeout)
	defer cancel()
	if p != nil && p.id == id {
		select {
		case <-p.done:
			if p.err == nil {
				return p.labels, nil
			}
			logrus.WithError(p.err).WithField("id", id).Debug("prefetched label lookup failed; looking up again")
		case <-ctx.Done():
			return nil, fmt.Errorf("labels of %s: %w", id, ctx.Err())
		}
	}
	return s.labels(ctx, id)
}

// New wraps inner.
func New(inner taskAPI.TaskService, cfg hook.Config, labels LabelFunc) *Service {
	return &Service{TaskService: inner, cfg: cfg, labels: labels, registered: map[string]bool{}}
}

// RegisterTTRPC registers the wrapper (not the inner service, whose overrides would then never run).
func (s *Service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTaskService(server, s)
	return nil
}

// Create registers the container, edits its spec and delegates to runc; on any later failure the registration is
// rolled back.
func (s *Service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	// config.json is read once per create: for the cgroup driver here and for registration (hook.Prepare).
	tStart := time.Now()
	spec, specErr := specmod.Load(filepath.Join(r.Bundle, "config.json"))
	cgroupsPath := ""
	if specErr == nil {
		cgroupsPath = spec.CgroupsPath()
	}
	opts, err := NormalizeOptions(r.Options, cgroupsPath)
	if err != nil {
		return nil, invalidArgument(fmt.Errorf("detshare shim: %w", err))
	}
	r.Options = opts
	t0 := time.Now()
	prep, labelsTime, err := s.prepare(ctx, r, spec)
	tPrepared := time.Now()
	if err != nil {
		return nil, invalidArgument(err)
	}
	if prep.Registered {
		s.mu.Lock()
		s.registered[r.ID] = true
		s.mu.Unlock()
	}
	resp, err := s.TaskService.Create(ctx, r)
	if prep.Registered {
		logPhases(r.ID, prep.Phases, map[string]time.Duration{"spec_load": t0.Sub(tStart), "labels": labelsTime,
			"prepare": tPrepared.Sub(t0), "runc_create": time.Since(tPrepared), "create": time.Since(tStart)})
	}
	if err != nil && prep.Registered {
		hook.Rollback(s.cfg, r.ID)
		s.forget(r.ID)
	}
	if err == nil && prep.FailedOpen != nil {
		// After Create: the task service holds its own write end of the fifo by now, so closing ours does not
		// give the engine's reader an EOF; the process has not started, so the line still comes first.
		writeNotice(r, hook.Notice(prep.FailedOpen))
	}
	return resp, err
}

// writeNotice puts msg on the container's stderr (its stdout with a terminal), where `ctr run`, `docker logs` and
// `kubectl logs` show it: the engine reads that fifo (or names a log file).
// Best effort: a binary:// logger or a closed reader loses the line, and the shim log keeps the warning.
func writeNotice(r *taskAPI.CreateTaskRequest, msg string) {
	target := r.Stderr
	if r.Terminal || target == "" {
		target = r.Stdout
	}
	if strings.HasPrefix(target, "file://") {
		target = strings.TrimPrefix(target, "file://")
	} else if strings.Contains(target, "://") {
		return
	}
	if target == "" || !filepath.IsAbs(target) {
		return
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
	if err != nil {
		logrus.WithError(err).WithField("id", r.ID).Debug("fail-open notice not written")
		return
	}
	defer f.Close()
	_, _ = f.WriteString(msg)
}

// invalidArgument is err as an InvalidArgument status. Quota messages contain '%' ("sms=200%"), and containerd
// before 1.7 passes the message through errdefs.ToGRPC, which uses it as a format string, once on the ctr path and
// twice on the CRI path, so no escaping survives both. For those daemons (they set no MAX_SHIM_VERSION for their
// shims) '%' is written as U+FF05 FULLWIDTH PERCENT SIGN, which reads the same and is no format verb.
func invalidArgument(err error) error {
	msg := err.Error()
	if os.Getenv("MAX_SHIM_VERSION") == "" {
		msg = strings.ReplaceAll(msg, "%", FullwidthPercent)
	}
	return status.Error(codes.InvalidArgument, msg)
}

// FullwidthPercent stands for '%' in refusals sent to containerd < 1.7.
const FullwidthPercent = "\uff05"

// logPhases logs, at debug level, how long each step of a registered container's create took, in milliseconds:
// the shim's own steps (own) and hook.Prepare's (BENCHMARKS.md, issue 28: where a container start's added time
// goes; BenchmarkStartPaired collects these lines when containerd runs at debug level).
func logPhases(id string, ph hook.Phases, own map[string]time.Duration) {
	if !logrus.IsLevelEnabled(logrus.DebugLevel) {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	f := logrus.Fields{"id": id, "setup_ms": ms(ph.Setup), "register_ms": ms(ph.Register),
		"open_table_ms": ms(ph.Tenant.OpenTable), "ensure_scheduler_ms": ms(ph.Tenant.EnsureScheduler),
		"table_register_ms": ms(ph.Tenant.Register), "devices_ms": ms(ph.Devices), "spec_edit_ms": ms(ph.Apply)}
	for k, d := range own {
		f[k+"_ms"] = ms(d)
	}
	logrus.WithFields(f).Debug("detshare create phases")
}

// prepare registers the container; spec is its config.json (nil when unreadable). It also returns how long the
// label lookup took.
func (s *Service) prepare(ctx context.Context, r *taskAPI.CreateTaskRequest, spec *specmod.Spec) (hook.Prepared, time.Duration, error) {
	if spec == nil {
		// hook.Prepare reports it (fail-open); an unreadable spec is not the user's quota.
		p, err := hook.Prepare(ctx, s.cfg, hook.Request{ID: r.ID, Bundle: r.Bundle})
		return p, 0, err
	}
	if spec.Annotations()[SandboxTypeAnnotation] == "sandbox" {
		return hook.Prepared{}, 0, nil // the pause container carries the pod's annotations but runs no GPU work
	}
	var labels map[string]string
	var err error
	_, cri := spec.Annotations()[SandboxTypeAnnotation]
	// Kubernetes reaches DetShare through annotations (container_annotations: the device plugin's allocation;
	// pod_annotations where passed) and the environment (DRA's CDI edits); CRI containers skip the label
	// round trip to containerd (~10 ms of start latency).
	var labelsTime time.Duration
	if s.labels != nil && !cri {
		t0 := time.Now()
		labels, err = s.containerLabels(ctx, r.ID)
		labelsTime = time.Since(t0)
		if err != nil {
			logrus.WithError(err).WithField("id", r.ID).Warn("containerd labels not read; using annotations and env")
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// Delete and Manager.Stop deregister; no poststop hook needed.
	p, err := hook.Prepare(pctx, s.cfg, hook.Request{ID: r.ID, Bundle: r.Bundle, Spec: spec, Labels: labels,
		NoPoststopHook: true})
	return p, labelsTime, err
}

func (s *Service) forget(id string) {
	s.mu.Lock()
	delete(s.registered, id)
	s.mu.Unlock()
}

// Delete delegates, then deregisters the init process's container.
func (s *Service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	resp, err := s.TaskService.Delete(ctx, r)
	if err == nil && r.ExecID == "" {
		s.mu.Lock()
		was := s.registered[r.ID]
		delete(s.registered, r.ID)
		s.mu.Unlock()
		if was {
			if derr := hook.Poststop(s.cfg, r.ID); derr != nil {
				logrus.WithError(derr).WithField("id", r.ID).Warn("deregistration at delete failed")
			}
		}
	}
	return resp, err
}
