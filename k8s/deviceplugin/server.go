package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin serves one resource over a socket in kubelet's device-plugin directory and registers it with kubelet.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Resource string
	Dir      string // kubelet's device-plugin directory (holds kubelet.sock)
	inv      Inventory
	log      *logrus.Entry

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

// ListAndWatch sends the units once (they are fixed for the node's GPUs) and holds the stream until Stop.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	ids, err := p.inv.Devices(p.Resource)
	if err != nil {
		return err
	}
	devs := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		devs[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-s.Context().Done():
	}
	return nil
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

// Allocate returns each container's quota annotations.
func (p *Plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		ann, err := p.inv.Allocation(p.Resource, c.DevicesIds)
		if err != nil {
			p.log.WithError(err).Warn("allocate refused")
			return nil, err
		}
		p.log.WithFields(logrus.Fields{"devices": len(c.DevicesIds), "annotations": ann}).Info("allocated")
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Annotations: ann})
	}
	return resp, nil
}

// PreStartContainer is not requested (GetDevicePluginOptions says so).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves every resource of inv in dir until ctx ends, serving and registering again whenever kubelet restarts
// (its socket directory is wiped, taking ours with it).
func Run(ctx context.Context, dir string, inv Inventory) error {
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
			if err := np.Serve(ctx); err != nil {
				np.log.WithError(err).Warn("registration failed; retrying")
				continue
			}
			plugins[i] = np
		}
	}
}
