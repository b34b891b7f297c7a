package cdi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const (
	uuidA = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"
	uuidB = "GPU-9d1b7c55-2a3e-5f4a-0c6d-1e2f3a4b5c6d"
	lib   = "/usr/lib/x86_64-linux-gnu"
)

// fixtureWriters returns the two ways a fixture host tree under root is written: a file with its mode, and a
// symbolic link; parent directories are made as needed.
func fixtureWriters(t *testing.T, root string) (file func(p, content string, mode os.FileMode), link func(p, target string)) {
	parent := func(p string) string {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		return full
	}
	file = func(p, content string, mode os.FileMode) {
		if err := os.WriteFile(parent(p), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	link = func(p, target string) {
		if err := os.Symlink(target, parent(p)); err != nil {
			t.Fatal(err)
		}
	}
	return file, link
}

// hostTree writes a fixture host under a temp root, shaped as a driver-580 host without the NVIDIA container
// toolkit: device nodes (symlinks to /dev/null, which stat as character devices 1:3), the driver's /proc files
// with the bus order not matching the minors, versioned libraries with their soname and development links, a
// stale library of an older driver, and nvidia-smi.
func hostTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	file, link := fixtureWriters(t, root)
	mk := func(p, content string) { file(p, content, 0o755) }
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
		link("dev/"+n, "/dev/null")
	}
	// Bus order: the first GPU (index 0) has minor 1.
	mk("proc/driver/nvidia/gpus/0000:19:00.0/information", "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t "+
		uuidB+"\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nBus Location: \t 0000:19:00.0\nDevice Minor: \t 1\nGPU Excluded:\t No\n")
	mk("proc/driver/nvidia/gpus/0000:3b:00.0/information", "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t "+uuidA+
		"\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 0\n")
	mk("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)  Tue Sep 30 2025\nGCC version:  gcc version 12.3.0\n")
	mk(lib+"/libcuda.so.580.95.05", "ELF")
	link(lib+"/libcuda.so.1", "libcuda.so.580.95.05")
	link(lib+"/libcuda.so", "libcuda.so.1")
	mk(lib+"/libcuda.so.535.54.03", "old driver")
	mk(lib+"/libnvidia-ml.so.580.95.05", "ELF")
	link(lib+"/libnvidia-ml.so.1", lib+"/libnvidia-ml.so.580.95.05")
	mk(lib+"/libnvidia-ptxjitcompiler.so.580.95.05", "ELF")
	link(lib+"/libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.580.95.05")
	mk(lib+"/libnvidia-ml.so.535.54.03", "old driver")
	mk("usr/bin/nvidia-smi", "#!/bin/sh\n")
	mk("usr/bin/nvidia-cuda-mps-control", "#!/bin/sh\n")
	return root
}

func TestDriverEditsFromDriverFiles(t *testing.T) {
	root := hostTree(t)
	d := Driver{Root: root, HookPath: "/usr/local/bin/detshare-hook"}
	gs, err := d.GPUs()
	if err != nil || len(gs) != 2 || gs[0].UUID != uuidB || gs[0].Minor != 1 || gs[1].Minor != 0 {
		t.Fatalf("GPUs = %+v, %v", gs, err)
	}
	if v := d.DriverVersion(); v != "580.95.05" {
		t.Errorf("driver version %q", v)
	}
	e, err := d.Edits(GPU{Index: 1, UUID: uuidA}) // UUID A is minor 0
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range e.DeviceNodes {
		nodes = append(nodes, n.Path)
		if n.Type != "c" || n.Major != 1 || n.Minor != 3 || n.HostPath != filepath.Join(root, n.Path) {
			t.Errorf("node %+v: want c 1:3 from the host node under the root", n)
		}
	}
	if want := []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("nodes %v, want %v (exactly this GPU's node; nvidia-modeset is absent on this host)", nodes, want)
	}
	got := map[string]string{}
	for _, m := range e.Mounts {
		got[m.ContainerPath] = strings.TrimPrefix(m.HostPath, root)
		if m.Type != "bind" || !reflect.DeepEqual(m.Options, MountOptions) {
			t.Errorf("mount %+v: want a read-only bind", m)
		}
	}
	want := map[string]string{
		lib + "/libcuda.so.580.95.05": lib + "/libcuda.so.580.95.05", lib + "/libcuda.so.1": lib + "/libcuda.so.580.95.05",
		lib + "/libcuda.so":                lib + "/libcuda.so.580.95.05",
		lib + "/libnvidia-ml.so.580.95.05": lib + "/libnvidia-ml.so.580.95.05", lib + "/libnvidia-ml.so.1": lib + "/libnvidia-ml.so.580.95.05",
		lib + "/libnvidia-ptxjitcompiler.so.580.95.05": lib + "/libnvidia-ptxjitcompiler.so.580.95.05",
		lib + "/libnvidia-ptxjitcompiler.so.1":         lib + "/libnvidia-ptxjitcompiler.so.580.95.05",
		"/usr/bin/nvidia-smi":                          "/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control": "/usr/bin/nvidia-cuda-mps-control",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mounts (container path: host file)\n got %v\nwant %v (no library of the old driver)", got, want)
	}
	wantHook := []Hook{{HookName: "createContainer", Path: "/usr/local/bin/detshare-hook",
		Args: []string{"detshare-hook", "ldcache", "--folder", lib}}}
	if !reflect.DeepEqual(e.Hooks, wantHook) {
		t.Errorf("hooks %+v, want %+v", e.Hooks, wantHook)
	}
	// By index alone: index 0 is the first GPU in bus order, minor 1.
	e0, err := d.Edits(GPU{Index: 0})
	if err != nil || GPUNode(e0) != "/dev/nvidia1" {
		t.Errorf("index 0: node %q, %v; want /dev/nvidia1", GPUNode(e0), err)
	}
}

func TestDriverErrorsNameTheCause(t *testing.T) {
	root := hostTree(t)
	d := Driver{Root: root}
	if _, err := d.Edits(GPU{Index: 0, UUID: "GPU-nope"}); err == nil || !strings.Contains(err.Error(), uuidA) {
		t.Errorf("unknown UUID: %v; want the driver's GPUs listed", err)
	}
	if _, err := d.Edits(GPU{Index: 5}); err == nil || !strings.Contains(err.Error(), "2 GPU(s)") {
		t.Errorf("index out of range: %v", err)
	}
	os.Remove(filepath.Join(root, "dev/nvidia-uvm"))
	if _, err := d.Edits(GPU{Index: 0}); err == nil || !strings.Contains(err.Error(), "nvidia-modprobe -u") {
		t.Errorf("no nvidia-uvm: %v; want the hint", err)
	}
	root = hostTree(t)
	for _, f := range []string{"libcuda.so.580.95.05", "libcuda.so.1", "libcuda.so", "libcuda.so.535.54.03"} {
		os.Remove(filepath.Join(root, lib, f))
	}
	if _, err := (Driver{Root: root}).Edits(GPU{Index: 0}); err == nil || !strings.Contains(err.Error(), "libcuda.so.<version>") {
		t.Errorf("no libcuda: %v", err)
	}
	// No /proc files (a root that only has the nodes): the index is the minor when its node exists.
	root = hostTree(t)
	os.RemoveAll(filepath.Join(root, "proc"))
	if e, err := (Driver{Root: root}).Edits(GPU{Index: 1}); err != nil || GPUNode(e) != "/dev/nvidia1" {
		t.Errorf("without /proc: %q, %v", GPUNode(e), err)
	}
	if _, err := (Driver{Root: root}).Edits(GPU{Index: 7}); err == nil {
		t.Error("without /proc, a GPU with no node was accepted")
	}
}

func TestParseNVIDIASpec(t *testing.T) {
	s, err := Load("testdata/nvidia.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind != NVIDIAKind || !reflect.DeepEqual(s.Names(), []string{"0", uuidA, "1", uuidB, "all"}) {
		t.Fatalf("kind %s names %v", s.Kind, s.Names())
	}
	e, ok := s.Device(uuidB)
	if !ok || GPUNode(e) != "/dev/nvidia1" || len(e.DeviceNodes) != 5 || len(e.Mounts) != 5 || len(e.Hooks) != 2 ||
		e.Hooks[1].Args[1] != "update-ldcache" || e.Env[0] != "NVIDIA_VISIBLE_DEVICES=void" {
		t.Errorf("device %s = %+v: want the spec-wide edits then its node", uuidB, e)
	}
	for _, bad := range []string{"cdiVersion: 0.5.0\nkind: nvidia\ndevices: []\n", "kind: nvidia.com/gpu\n",
		"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: x\n  containerEdits:\n    deviceNodes:\n    - path: dev/nvidia0\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// The host source prefers NVIDIA's spec (found by UUID, then index; numbers filled in from the host's nodes) and
// falls back to the driver's files for a GPU the spec does not name.
func TestHostPrefersNVIDIASpec(t *testing.T) {
	root := hostTree(t)
	data, _ := os.ReadFile("testdata/nvidia.yaml")
	os.MkdirAll(filepath.Join(root, "etc/cdi"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/cdi/nvidia.yaml"), data, 0o644)
	os.WriteFile(filepath.Join(root, "etc/cdi/broken.json"), []byte("{"), 0o644) // skipped, not fatal
	os.Symlink("/dev/null", filepath.Join(root, "dev/nvidia-modeset"))           // the spec's host had it
	h := Host{Root: root, HookPath: "/usr/local/bin/detshare-hook"}
	for _, g := range []GPU{{Index: 1, UUID: uuidB}, {Index: 1}} {
		e, err := h.Edit(g)
		if err != nil {
			t.Fatal(err)
		}
		wantName := NVIDIAKind + "=" + uuidB
		if g.UUID == "" {
			wantName = NVIDIAKind + "=1"
		}
		if e.Name != wantName || e.Node != "/dev/nvidia1" || !strings.HasSuffix(e.From, "etc/cdi/nvidia.yaml") {
			t.Errorf("%+v: name %q node %q from %q", g, e.Name, e.Node, e.From)
		}
		for _, n := range e.Edits.DeviceNodes {
			if n.Type != "c" || n.Major != 1 || n.Minor != 3 {
				t.Errorf("node %+v not resolved from the host", n)
			}
		}
		if len(e.Edits.Hooks) != 2 || e.Edits.Hooks[0].Path != "/usr/bin/nvidia-cdi-hook" {
			t.Errorf("NVIDIA's hooks not kept: %+v", e.Edits.Hooks)
		}
	}
	// A GPU the spec does not know: generated from the driver's files.
	e, err := h.Edit(GPU{Index: 0, UUID: "GPU-not-in-spec"})
	if err == nil {
		t.Errorf("unknown UUID gave %+v", e)
	}
	os.Remove(filepath.Join(root, "etc/cdi/nvidia.yaml"))
	e, err = h.Edit(GPU{Index: 1, UUID: uuidA})
	if err != nil || e.Name != "" || e.Node != "/dev/nvidia0" || !strings.HasPrefix(e.From, "driver files") {
		t.Errorf("without NVIDIA's spec: %+v, %v", e, err)
	}
}

func TestSpecForRoundTrips(t *testing.T) {
	root := hostTree(t)
	h := Host{Root: root}
	var edits []Edit
	for _, g := range []GPU{{Index: 0, UUID: uuidB}, {Index: 1, UUID: uuidA}} {
		e, err := h.Edit(g)
		if err != nil {
			t.Fatal(err)
		}
		edits = append(edits, e)
	}
	s := SpecFor(edits)
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if !reflect.DeepEqual(back.Names(), []string{"0", uuidB, "1", uuidA, "all"}) {
		t.Errorf("names %v", back.Names())
	}
	all, _ := back.Device("all")
	var gpuNodes []string
	for _, n := range all.DeviceNodes {
		if IsGPUNode(n.Path) {
			gpuNodes = append(gpuNodes, n.Path)
		}
	}
	if !reflect.DeepEqual(gpuNodes, []string{"/dev/nvidia1", "/dev/nvidia0"}) || len(all.Mounts) != len(edits[0].Edits.Mounts) {
		t.Errorf("all: nodes %v, %d mounts; want both GPUs and the libraries once", gpuNodes, len(all.Mounts))
	}
	one, _ := back.Device(uuidA)
	if !reflect.DeepEqual(one, edits[1].Edits) {
		t.Errorf("round trip changed the edit:\n got %+v\nwant %+v", one, edits[1].Edits)
	}
}

func TestIsGPUNode(t *testing.T) {
	for p, want := range map[string]bool{"/dev/nvidia0": true, "/dev/nvidia12": true, "/dev/nvidiactl": false,
		"/dev/nvidia-uvm": false, "/dev/nvidia": false, "/dev/detshare-simgpu3": true, "/dev/nvidia-caps/x1": false} {
		if IsGPUNode(p) != want {
			t.Errorf("IsGPUNode(%s) = %v", p, !want)
		}
	}
}

// UpdateLDCache rebuilds the container's loader cache with the host's ldconfig: a library in a folder the image
// does not list becomes findable, and the folder is recorded in ld.so.conf.d for the image's own ldconfig runs.
func TestUpdateLDCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (ldconfig -r chroots)")
	}
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc/ld.so.conf.d"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc/ld.so.conf"), []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644)
	os.MkdirAll(filepath.Join(rootfs, "opt/gpu"), 0o755)
	libc, err := os.ReadFile("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		t.Fatalf("a real shared library to index: %v", err)
	}
	os.WriteFile(filepath.Join(rootfs, "opt/gpu/libc.so.6"), libc, 0o755)
	if err := UpdateLDCache(rootfs, []string{"/opt/gpu"}); err != nil {
		t.Fatal(err)
	}
	cache, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
	if err != nil || !bytes.Contains(cache, []byte("/opt/gpu/libc.so.6")) {
		t.Errorf("ld.so.cache does not list /opt/gpu/libc.so.6: %v", err)
	}
	if conf, _ := os.ReadFile(filepath.Join(rootfs, LdconfConf)); string(conf) != "/opt/gpu\n" {
		t.Errorf("%s = %q", LdconfConf, conf)
	}
	if err := UpdateLDCache(rootfs, []string{"opt/gpu"}); err == nil {
		t.Error("relative folder accepted")
	}
}

// The layout of the H100 host this project is checked on (driver 580, no nvidia-ctk): the driver's files in
// /usr/local/nvidia/lib64 and /usr/local/nvidia/bin, absolute links to them in /usr/lib (/lib -> usr/lib), and a
// /usr/bin/nvidia-smi that is a wrapper script. Each library is mounted with its links in both directories, each
// copy of a tool, and the loader hook names the directory of the real files.
func TestDriverEditsSandboxLayout(t *testing.T) {
	root := t.TempDir()
	mk, link := fixtureWriters(t, root)
	for _, n := range []string{"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
		link("dev/"+n, "/dev/null")
	}
	mk("proc/driver/nvidia/gpus/0000:00:06.0/information", "GPU UUID: \t GPU-f07a2ec8-f7ba-68fd-a492-272370a719fd\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\n", 0o644)
	mk("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n", 0o644)
	nv := "/usr/local/nvidia/lib64"
	mk(nv+"/libcuda.so.580.159.04", "ELF", 0o755)
	link(nv+"/libcuda.so.1", "libcuda.so.580.159.04")
	link(nv+"/libcuda.so", "libcuda.so.1")
	link("usr/lib/libcuda.so.1", nv+"/libcuda.so.1")
	link("usr/lib/libcuda.so", nv+"/libcuda.so")
	link("lib", "usr/lib")
	mk("usr/bin/nvidia-smi", "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n", 0o755)
	mk("usr/local/nvidia/bin/nvidia-smi", "ELF", 0o755)
	e, err := Driver{Root: root, HookPath: "/opt/detshare/bin/detshare-hook"}.Edits(GPU{Index: 0, UUID: "GPU-f07a2ec8-f7ba-68fd-a492-272370a719fd"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range e.Mounts {
		got[m.ContainerPath] = strings.TrimPrefix(m.HostPath, root)
	}
	real := nv + "/libcuda.so.580.159.04"
	want := map[string]string{real: real, nv + "/libcuda.so.1": real, nv + "/libcuda.so": real,
		"/usr/lib/libcuda.so.1": real, "/usr/lib/libcuda.so": real,
		"/usr/bin/nvidia-smi": "/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi": "/usr/local/nvidia/bin/nvidia-smi"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mounts\n got %v\nwant %v", got, want)
	}
	if len(e.Hooks) != 1 || !reflect.DeepEqual(e.Hooks[0].Args, []string{"detshare-hook", "ldcache", "--folder", nv}) {
		t.Errorf("hooks %+v", e.Hooks)
	}
}
