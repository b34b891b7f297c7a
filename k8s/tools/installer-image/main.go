// Command installer-image writes the installer image tar (package installerimage); `make installer-image` runs it on
// `make build`'s output, and k8s/Dockerfile.installer builds the same image with Docker.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/detshare/detshare/k8s/installerimage"
)

func main() {
	build := flag.String("build", "build", "make build's output directory")
	out := flag.String("o", "build/images/detshare-installer.tar", "image tar to write")
	tag := flag.String("tag", "detshare-installer:latest", "image name and tag")
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox (Debian: busybox-static)")
	flag.Parse()
	if err := installerimage.Pack(*build, *out, *tag, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "installer-image:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}
