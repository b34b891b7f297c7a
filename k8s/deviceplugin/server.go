package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/detshare/detshare/cgroupgpu/cdi"
	"github.com/detshare/detshare/cgroupgpu/quota"
)

// Plugin serves one resource over a socket in kubelet's device-plugin directory and registers it with kubelet.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Resource string
	Dir      string // kubelet's device-plugin directory (holds kubelet.sock)
	// Devices gives each allocated container the GPU its units are on (cgroupgpu/cdi): device nodes and mounts in
	// the response, and the CDI device name when NVIDIA's CDI spec names the GPU. nil: annotations only.
	Devices cdi.Source
	// Health says which GPUs are unhealthy (nil: all healthy); ListAndWatch polls it every HealthInterval and sends
	// the units again whenever it changes, so kubelet stops placing pods on a failed GPU and resumes on recovery.
	Health         Health
	HealthInterval time.Duration // 0: 1 s
	inv            Inventory
	log            *logrus.Entry

	srv    *grpc.Server
	socket string
	stop   chan struct{}
	once   sync.Once
}

// New makes the plugin of resource for inv.
func New(resource, dir string, inv Inventory) (*Plugin, error) {
	if _, err := kindOf(resource); err != nil {
		return nil, err
	}
	name := "detshare-gpu.sock"
	if resource == ResourceMemory {
		name = "detshare-gpu-memory.sock"
	}
	return &Plugin{Resource: resource, Dir: dir, inv: inv, socket: filepath.Join(dir, name), stop: make(chan struct{}),
		log: logrus.WithField("resource", resource)}, nil
}

// Serve listens on the plugin socket and registers with kubelet. It returns once registered; the server runs until
// Stop.
func (p *Plugin) Serve(ctx context.Context) error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listen %s: %w", p.socket, err)
	}
	p.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.srv, p)
	go p.srv.Serve(lis)
	if err := p.register(ctx); err != nil {
		p.Stop()
		return err
	}
	return nil
}

func (p *Plugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.Dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial kubelet: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.Resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", p.Resource, err)
	}
	p.log.WithField("socket", p.socket).Info("registered with kubelet")
	return nil
}

// Stop ends the server and removes its socket.
func (p *Plugin) Stop() {
	p.once.Do(func() {
		close(p.stop)
		if p.srv != nil {
			p.srv.Stop()
		}
		os.Remove(p.socket)
	})
}

// SocketGone reports whether the plugin's socket vanished: kubelet wipes its device-plugin directory when it
// restarts, and a plugin must then serve and register again.
func (p *Plugin) SocketGone() bool {
	_, err := os.Stat(p.socket)
	return errors.Is(err, os.ErrNotExist)
}

// GetDevicePluginOptions implements the device plugin API.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the units with their health, and again whenever Health changes, until Stop.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	ids, err := p.inv.Devices(p.Resource)
	if err != nil {
		return err
	}
	send := func(unhealthy map[int]string) error {
		devs := make([]*pluginapi.Device, len(ids))
		for i, id := range ids {
			devs[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
			if g, _, _, err := parseDeviceID(id); err == nil && unhealthy[g] != "" {
				devs[i].Health = pluginapi.Unhealthy
			}
		}
		return s.Send(&pluginapi.ListAndWatchResponse{Devices: devs})
	}
	last := p.Health.now()
	if err := send(last); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(s.Context())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return p.Health.Watch(ctx, p.HealthInterval, last, func(now, was map[int]string) error {
		p.log.WithFields(logrus.Fields{"unhealthy": now, "was": was}).Warn("GPU health changed: sending the units again")
		return send(now)
	})
}

// GetPreferredAllocation keeps each container's units on one GPU.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.ContainerRequests {
		ids, err := p.inv.Preferred(p.Resource, c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize))
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate returns each container's quota annotations and the GPU its units are on (Devices).
func (p *Plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		ann, err := p.inv.Allocation(p.Resource, c.DevicesIds)
		if err != nil {
			p.log.WithError(err).Warn("allocate refused")
			return nil, err
		}
		cr := &pluginapi.ContainerAllocateResponse{Annotations: ann}
		if p.Devices != nil {
			// Without the edit the container still gets its quota, and the DetShare runtime handler gives it the
			// GPU at create time; a plugin that cannot see the driver must not block the pod.
			if err := p.addGPU(cr, ann[quota.CeilingAnnotationKey(quota.FieldGPU)]); err != nil {
				p.log.WithError(err).Warn("no GPU device edit in the allocation (annotations only)")
			}
		}
		p.log.WithFields(logrus.Fields{"devices": len(c.DevicesIds), "annotations": ann, "gpu_nodes": len(cr.Devices),
			"cdi": cr.CdiDevices}).Info("allocated")
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// addGPU puts GPU index's edit into cr: its device nodes and read-only mounts (which every runtime applies), its
// environment, and its CDI name when it comes from NVIDIA's CDI spec (a CDI-enabled runtime then also runs that
// spec's hooks; it replaces entries at the same paths, so nothing is doubled). The two resources of one container
// hand out the same GPU; the runtime keeps one node per path.
func (p *Plugin) addGPU(cr *pluginapi.ContainerAllocateResponse, index string) error {
	i, err := strconv.Atoi(index)
	if err != nil {
		return fmt.Errorf("allocation names GPU %q: %w", index, err)
	}
	g, ok := p.inv.gpu(i)
	if !ok {
		return fmt.Errorf("allocation names GPU %d, which this node does not have", i)
	}
	e, err := p.Devices.Edit(cdi.GPU{Index: g.Index, UUID: g.UUID})
	if err != nil {
		return fmt.Errorf("GPU %d (%s): %w", g.Index, g.UUID, err)
	}
	for _, n := range e.Edits.DeviceNodes {
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		perm := n.Permissions
		if perm == "" {
			perm = "rwm"
		}
		cr.Devices = append(cr.Devices, &pluginapi.DeviceSpec{ContainerPath: n.Path, HostPath: host, Permissions: perm})
	}
	for _, m := range e.Edits.Mounts {
		ro := false
		for _, o := range m.Options {
			ro = ro || o == "ro"
		}
		cr.Mounts = append(cr.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: ro})
	}
	for _, kv := range e.Edits.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			if cr.Envs == nil {
				cr.Envs = map[string]string{}
			}
			cr.Envs[k] = v
		}
	}
	if e.Name != "" {
		cr.CdiDevices = append(cr.CdiDevices, &pluginapi.CDIDevice{Name: e.Name})
	}
	return nil
}

// PreStartContainer is not requested (GetDevicePluginOptions says so).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves every resource of inv in dir until ctx ends, giving containers their GPU from devices (nil: none) and
// marking the units of the GPUs health reports unhealthy (nil: all healthy), serving and registering again whenever
// kubelet restarts (its socket directory is wiped, taking ours with it).
func Run(ctx context.Context, dir string, inv Inventory, devices cdi.Source, health Health) error {
	var plugins []*Plugin
	defer func() {
		for _, p := range plugins {
			p.Stop()
		}
	}()
	for _, res := range []string{ResourceShares, ResourceMemory} {
		p, err := New(res, dir, inv)
		if err != nil {
			return err
		}
		p.Devices, p.Health = devices, health
		if err := p.Serve(ctx); err != nil {
			return err
		}
		plugins = append(plugins, p)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for i, p := range plugins {
			if !p.SocketGone() {
				continue
			}
			p.log.Info("kubelet restarted (socket gone): registering again")
			p.Stop()
			np, err := New(p.Resource, dir, inv)
			if err != nil {
				return err
			}
			np.Devices, np.Health = devices, health
			if err := np.Serve(ctx); err != nil {
				np.log.WithError(err).Warn("registration failed; retrying")
				continue
			}
			plugins[i] = np
		}
	}
}
