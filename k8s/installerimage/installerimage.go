// Package installerimage packs DetShare's built binaries into the installer image the Helm chart
// (configs/helm/detshare) runs, offline (no Docker, no registry), as an image tar in the `docker save` format that
// `ctr -n k8s.io images import`, `docker load` and `podman load` read:
//
//	/opt/detshare/bin/{detshare,detshare-hook,detshare-runtime,containerd-shim-detshare-v1,
//	  containerd-shim-detshare-v1-serve,detshare-device-plugin,detshare-dra-plugin}
//	/opt/detshare/lib/libdetshare.so
//	/bin/busybox and its applets (sh, nsenter, chroot, sleep, mkdir, cp, chmod, mv, rm, rmdir) for the installer's scripts
//	the shared libraries the binaries need (glibc), as ldd resolves them on the build host
package installerimage

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/detshare/detshare/internal/ociimage"
)

// Binaries are the programs the image carries.
var Binaries = []string{"detshare", "detshare-hook", "detshare-runtime", "containerd-shim-detshare-v1",
	"containerd-shim-detshare-v1-serve", "detshare-device-plugin", "detshare-dra-plugin"}

// Pack writes the image tagged tag to out from make build's output directory build.
func Pack(build, out, tag, busybox string) error {
	files := []ociimage.File{{Path: "bin/busybox", Src: busybox, Mode: 0o755}}
	for _, applet := range []string{"sh", "nsenter", "chroot", "sleep", "cat", "ls", "mkdir", "cp", "chmod", "mv", "rm", "rmdir"} {
		files = append(files, ociimage.File{Path: "bin/" + applet, Link: "busybox"})
	}
	var elf []string
	for _, b := range Binaries {
		src := filepath.Join(build, "bin", b)
		files = append(files, ociimage.File{Path: "opt/detshare/bin/" + b, Src: src, Mode: 0o755})
		elf = append(elf, src)
	}
	lib := filepath.Join(build, "lib", "libdetshare.so")
	files = append(files, ociimage.File{Path: "opt/detshare/lib/libdetshare.so", Src: lib, Mode: 0o644})
	for _, f := range append(elf, lib) {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: run `make build` first", err)
		}
	}
	libs, err := ociimage.SharedLibs(append(elf, lib)...)
	if err != nil {
		return err
	}
	for _, l := range libs {
		files = append(files, ociimage.File{Path: l[1:], Src: l, Mode: 0o755})
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cfg := map[string]any{"Env": []string{"PATH=/opt/detshare/bin:/bin"}, "Cmd": []string{"/bin/sh"}}
	_, err = ociimage.WriteImage(out, tag, files, cfg)
	return err
}
