package e2e

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/detshare/detshare/integration/testenv"
)

// criClient talks to containerd's CRI plugin as kubelet does.
func (c *cluster) criClient() (cri.RuntimeServiceClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+c.ctrSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return cri.NewRuntimeServiceClient(conn), func() { conn.Close() }, nil
}

// podObjects lists the running containers and ready sandboxes of namespace ns's pods, as kubelet sees them.
func (c *cluster) podObjects(ns string) ([]string, error) {
	rt, done, err := c.criClient()
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sel := map[string]string{"io.kubernetes.pod.namespace": ns}
	cs, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{LabelSelector: sel,
		State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ct := range cs.Containers {
		out = append(out, fmt.Sprintf("container %s (%s)", ct.Id, ct.Metadata.GetName()))
	}
	ps, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{LabelSelector: sel,
		State: &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY}}})
	if err != nil {
		return nil, err
	}
	for _, p := range ps.Items {
		out = append(out, fmt.Sprintf("sandbox %s (%s)", p.Id, p.Metadata.GetName()))
	}
	return out, nil
}

// removeSandboxes stops and removes every pod sandbox through CRI, as kubelet would, so that containerd 2.x's
// sandbox shims exit (killing tasks alone leaves them).
func (c *cluster) removeSandboxes() {
	rt, done, err := c.criClient()
	if err != nil {
		return
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ps, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, p := range ps.Items {
		rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.Id})
		rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.Id})
	}
}

// killStragglers ends, by pid, processes still naming the test directory (shims of a containerd that is gone).
func (c *cluster) killStragglers() {
	for _, pid := range testenv.ProcessesNaming(c.dir) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
