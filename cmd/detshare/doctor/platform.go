package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/detshare/detshare/internal/kubeletdevices"
)

// The platform around DetShare on a Kubernetes node: NVIDIA's container toolkit, the CDI specs present, the
// kubelet's version, the device plugins and DRA drivers registered with it, and whether another plugin advertises a
// GPU DetShare serves. None of it is needed (Info when absent); two plugins advertising one GPU is a failure.

// cdiKind reads a CDI spec's kind (YAML or JSON).
var cdiKind = regexp.MustCompile(`(?m)(?:^kind:\s*"?|"kind"\s*:\s*")([A-Za-z0-9.\-_/]+)`)

func checkPlatform(env Env) []Check {
	return []Check{checkToolkit(env), checkCDI(env), checkKubelet(env), checkDevicePlugins(env), checkDRADrivers(env)}
}

func checkToolkit(env Env) Check {
	c := Check{Name: "nvidia toolkit", Need: "optional: DetShare uses NVIDIA's CDI spec for a GPU when the toolkit " +
		"(or the GPU Operator) wrote one, else generates the GPU's edit from the driver's files"}
	for _, tool := range []string{"nvidia-ctk", "nvidia-container-runtime"} {
		if _, err := env.LookPath(tool); err == nil {
			out, _ := env.Output(tool, "--version")
			c.Status, c.Found = OK, tool+": "+firstLine(out)
			return c
		}
	}
	c.Status, c.Found = Info, "not found"
	return c
}

func checkCDI(env Env) Check {
	c := Check{Name: "cdi", Need: "optional: CDI specs (NVIDIA's nvidia.com/gpu, DetShare DRA claims' detshare.io/gpu) in " +
		strings.Join(env.CDIDirs, ", ")}
	kinds := map[string][]string{}
	for _, dir := range env.CDIDirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".yaml" && ext != ".json") {
				continue
			}
			p := filepath.Join(dir, e.Name())
			data, err := env.ReadFile(p)
			if err != nil {
				continue
			}
			if m := cdiKind.FindSubmatch(data); m != nil {
				kinds[string(m[1])] = append(kinds[string(m[1])], p)
			}
		}
	}
	if len(kinds) == 0 {
		c.Status, c.Found = Info, "no CDI spec"
		return c
	}
	var found []string
	for _, k := range sortedKeys(kinds) {
		if len(kinds[k]) == 1 {
			found = append(found, k+" ("+kinds[k][0]+")")
		} else {
			found = append(found, fmt.Sprintf("%s (%d specs)", k, len(kinds[k])))
		}
	}
	c.Status, c.Found = OK, strings.Join(found, "; ")
	return c
}

func checkKubelet(env Env) Check {
	c := Check{Name: "kubernetes", Need: "optional: kubelet, for DetShare's device plugin or DRA driver"}
	if _, err := env.LookPath("kubelet"); err != nil {
		c.Status, c.Found = Info, "kubelet not found on PATH"
		return c
	}
	out, err := env.Output("kubelet", "--version")
	if err != nil {
		c.Status, c.Found = Warn, "kubelet --version: "+err.Error()
		return c
	}
	c.Status, c.Found = OK, firstLine(out)
	return c
}

// checkDevicePlugins lists the resources kubelet's device plugins advertise and fails when a GPU of this node is
// advertised both by DetShare's device plugin and by another (DetShare's plugin leaves such a GPU alone; seeing both
// means an older DetShare or a checkpoint written before it noticed).
func checkDevicePlugins(env Env) Check {
	c := Check{Name: "device plugins", Need: "one device plugin per GPU: DetShare's (detshare.io/gpu) or NVIDIA's (nvidia.com/gpu)"}
	reg, err := kubeletdevices.Registered(env.DevicePluginDir)
	if err != nil {
		c.Status, c.Found = Warn, err.Error()
		return c
	}
	if len(reg) == 0 {
		c.Status, c.Found = Info, "none registered with kubelet ("+filepath.Join(env.DevicePluginDir, kubeletdevices.CheckpointFile)+")"
		return c
	}
	var found []string
	for _, res := range sortedKeys(reg) {
		found = append(found, fmt.Sprintf("%s: %d", res, len(reg[res])))
	}
	c.Status, c.Found = OK, strings.Join(found, ", ")
	ours := func(res string) bool { return strings.HasPrefix(res, "detshare.io/") }
	var others []string
	for res := range reg {
		if !ours(res) {
			others = append(others, res)
		}
	}
	if len(others) == 0 || env.Simulated || env.Driver == nil {
		return c
	}
	var both []string
	for _, g := range env.Driver().GPUs {
		claim := kubeletdevices.Claimants(reg, g.UUID, ours)
		prefix := fmt.Sprintf("gpu%d-", g.Index)
		detshare := slices.ContainsFunc(reg["detshare.io/gpu"], func(id string) bool { return strings.HasPrefix(id, prefix) })
		if len(claim) > 0 {
			c.Found += fmt.Sprintf("; GPU %d (%s): %s", g.Index, g.UUID, strings.Join(claim, ", "))
		}
		if len(claim) > 0 && detshare {
			both = append(both, fmt.Sprintf("GPU %d (%s): detshare.io/gpu and %s", g.Index, g.UUID, strings.Join(claim, ", ")))
		}
	}
	if len(both) > 0 {
		c.Status, c.Found = Fail, "advertised twice: "+strings.Join(both, "; ")
		c.Fix = "give each GPU to one plugin: detshare-device-plugin --gpus (chart devicePlugin.gpus), NVIDIA_VISIBLE_DEVICES " +
			"on NVIDIA's device plugin, or the node label nvidia.com/gpu.deploy.device-plugin=false (docs/kubernetes.md \"Coexistence\")"
	}
	return c
}

func checkDRADrivers(env Env) Check {
	c := Check{Name: "dra drivers", Need: "optional: DetShare's DRA driver gpu.detshare.io (not beside NVIDIA's gpu.nvidia.com on the same GPUs), " +
		"and the DRA features the apiserver serves as its plugin found them"}
	drivers, err := kubeletdevices.DRADrivers(env.PluginsRegistry)
	if err != nil {
		c.Status, c.Found = Warn, err.Error()
		return c
	}
	if len(drivers) == 0 {
		c.Status, c.Found = Info, "none registered with kubelet ("+env.PluginsRegistry+")"
		return c
	}
	c.Status, c.Found = OK, strings.Join(drivers, ", ")
	// What DetShare's DRA plugin found of the apiserver (it probes the DRA features with dry-run creates and writes
	// them beside its sockets; doctor needs no API access).
	dir := filepath.Join(filepath.Dir(env.PluginsRegistry), "plugins", "gpu.detshare.io")
	if p, err := kubeletdevices.ReadDRAPlatform(dir); err != nil {
		c.Found += "; " + err.Error()
	} else if p != nil {
		served := strings.Join(p.Served, ", ")
		if served == "" {
			served = "none"
		}
		c.Found += fmt.Sprintf("; gpu.detshare.io found Kubernetes %s serving DRA features: %s", p.Kubernetes, served)
		if len(p.Withheld) > 0 {
			c.Found += "; withheld or tainted: " + strings.Join(p.Withheld, "; ")
		}
	}
	has := func(prefix string) bool {
		return slices.ContainsFunc(drivers, func(d string) bool { return strings.HasPrefix(d, prefix) })
	}
	if has("gpu.detshare.io") && has("gpu.nvidia.com") {
		c.Status = Warn
		c.Fix = "both DRA drivers publish this node's GPUs: configure NVIDIA's to leave DetShare's GPUs out, or run one driver per node"
	}
	return c
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
