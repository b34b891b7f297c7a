package shimv2

import (
	"fmt"
	"os"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"
)

// runcOptionKeys are the runc option keys accepted in a generic options body (CRI's [runtimes.detshare.options]
// table, Docker ≥24 daemon.json "options"), with the Go field names of options.Options as CRI writes them.
const runcOptionKeys = "BinaryName, Root, SystemdCgroup, NoPivotRoot, NoNewKeyring, ShimCgroup, IoUid, IoGid, CriuImagePath, CriuWorkPath"

type runcOptionsTOML struct {
	BinaryName    string `toml:"BinaryName"`
	Root          string `toml:"Root"`
	SystemdCgroup bool   `toml:"SystemdCgroup"`
	NoPivotRoot   bool   `toml:"NoPivotRoot"`
	NoNewKeyring  bool   `toml:"NoNewKeyring"`
	ShimCgroup    string `toml:"ShimCgroup"`
	IoUid         uint32 `toml:"IoUid"`
	IoGid         uint32 `toml:"IoGid"`
	CriuImagePath string `toml:"CriuImagePath"`
	CriuWorkPath  string `toml:"CriuWorkPath"`
}

// systemdCgroupsPath tells whether a spec's linux.cgroupsPath has the systemd form "slice:prefix:name".
func systemdCgroupsPath(p string) bool {
	parts := strings.Split(p, ":")
	return len(parts) == 3 && parts[0] != "" && parts[2] != "" && !strings.HasPrefix(p, "/")
}

// NormalizeOptions turns the runtime options a create request carries into what the runc task service accepts.
// The runc service type-asserts *options.Options and panics on anything else, but CRI and Docker ≥24 send
// runtimeoptions.Options (a TOML body or a config path) to any runtime type that is not runc's. Options that did not
// come as runc options lose the engine's SystemdCgroup setting, so when the spec's cgroupsPath has the systemd form
// ("slice:prefix:name", what Docker and kubelet write with the systemd driver) SystemdCgroup is turned on; runc
// would otherwise create a cgroupfs directory of that literal name. nil stays nil unless that applies.
func NormalizeOptions(in *anypb.Any, cgroupsPath string) (*anypb.Any, error) {
	systemd := systemdCgroupsPath(cgroupsPath)
	if in == nil || len(in.GetValue()) == 0 && in.GetTypeUrl() == "" {
		if !systemd {
			return in, nil
		}
		a, err := typeurl.MarshalAny(&options.Options{SystemdCgroup: true})
		if err != nil {
			return nil, fmt.Errorf("encode runc options: %w", err)
		}
		return protobuf.FromAny(a), nil
	}
	v, err := typeurl.UnmarshalAny(in)
	if err != nil {
		return nil, fmt.Errorf("runtime options of type %q: %w", in.GetTypeUrl(), err)
	}
	switch o := v.(type) {
	case *options.Options:
		return in, nil
	case *runtimeoptions.Options:
		body := o.ConfigBody
		if len(body) == 0 && o.ConfigPath != "" {
			if body, err = os.ReadFile(o.ConfigPath); err != nil {
				return nil, fmt.Errorf("runtime options ConfigPath: %w", err)
			}
		}
		var t runcOptionsTOML
		md, err := toml.Decode(string(body), &t)
		if err != nil {
			return nil, fmt.Errorf("runtime options body: %w", err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			return nil, fmt.Errorf("runtime options key %q: allowed keys are %s", und[0].String(), runcOptionKeys)
		}
		ro := &options.Options{BinaryName: t.BinaryName, Root: t.Root, SystemdCgroup: t.SystemdCgroup,
			NoPivotRoot: t.NoPivotRoot, NoNewKeyring: t.NoNewKeyring, ShimCgroup: t.ShimCgroup,
			IoUid: t.IoUid, IoGid: t.IoGid, CriuImagePath: t.CriuImagePath, CriuWorkPath: t.CriuWorkPath}
		if systemd && !md.IsDefined("SystemdCgroup") {
			ro.SystemdCgroup = true
		}
		a, err := typeurl.MarshalAny(ro)
		if err != nil {
			return nil, fmt.Errorf("encode runc options: %w", err)
		}
		return protobuf.FromAny(a), nil
	default:
		return nil, fmt.Errorf("runtime options of type %q: allowed are containerd.runc.v1.Options and runtimeoptions.v1.Options", in.GetTypeUrl())
	}
}
