package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/urfave/cli/v2"

	"github.com/detshare/detshare/cmd/detshare/doctor"
	"github.com/detshare/detshare/internal/atomicfile"
	"github.com/detshare/detshare/internal/layout"
)

// Paths and names the installers register.
const (
	installRuntimeName = "detshare"
	installShimType    = "io.containerd.detshare.v1"
	installAnnotations = "detshare.io/*"       // pods' own quota keys (pod_annotations, only with --pod-annotations)
	installAllocation  = "alloc.detshare.io/*" // the device plugin's ceiling (container_annotations)
	defaultDaemonJSON  = "/etc/docker/daemon.json"
	defaultCtrdConfig  = "/etc/containerd/config.toml"
	defaultCtrdDropIn  = "/etc/containerd/conf.d/detshare.toml"
	defaultRuntimeBin  = "/usr/local/bin/detshare-runtime"            // `make install`'s; the .deb's is /usr/bin
	defaultShimBin     = "/usr/local/bin/containerd-shim-detshare-v1" // used when no shim sits next to detshare
	backupSuffix       = ".detshare-backup"
	beginMarker        = "# BEGIN detshare (added by `detshare install containerd`; `detshare uninstall containerd` removes it)"
	endMarker          = "# END detshare"
)

func installCommand() *cli.Command {
	dry := &cli.BoolFlag{Name: "dry-run", Usage: "print the file that would be written and change nothing"}
	return &cli.Command{
		Name:  "install",
		Usage: "register the detshare runtime with Docker or containerd",
		Description: `Edits the engine's configuration idempotently (a second run changes nothing), keeps a copy of the
original next to it (` + backupSuffix + `), prints every line it added or removed, and says what to restart. Every
binary it registers must exist and be executable (default: the one next to this detshare binary), else nothing is
changed. The containerd CRI handler names the shim by absolute path (runtime_path); ` + "`ctr run --runtime " +
			installShimType + "`" + ` finds it on containerd's PATH.

  docker:     daemon.json "runtimes": {"detshare": …}. Docker < 24 gets the runc wrapper (a "path" runtime; Docker
              20.10 cannot name a shim); Docker ≥ 24 the containerd shim through "runtimeType".
  containerd: the CRI runtime handler "detshare" (runtime_type io.containerd.detshare.v1) with
              container_annotations = ["alloc.detshare.io/*"] (the device plugin's allocation, the container's
              ceiling) and, only with --pod-annotations, pod_annotations = ["detshare.io/*"] (pods' own quota keys,
              which can lower an allocation, never raise it; a pod with none that sets them is refused). The existing config's version decides (containerd --version
              when there is none): version 2 (containerd 1.x): a marked section in config.toml (1.x imports would
              replace the whole CRI section), plugin "io.containerd.grpc.v1.cri"; version 3 (containerd 2.x): a
              drop-in and an imports entry, plugin "io.containerd.cri.v1.runtime".`,
		Subcommands: []*cli.Command{
			{
				Name:  "docker",
				Usage: "add the detshare runtime to Docker's daemon.json",
				Flags: []cli.Flag{dry,
					&cli.StringFlag{Name: "config", Value: defaultDaemonJSON, EnvVars: []string{"DETSHARE_DOCKER_CONFIG"}, Usage: "daemon.json to edit"},
					&cli.StringFlag{Name: "docker-version", Value: "auto", Usage: "Docker version (auto: ask dockerd --version)"},
					&cli.StringFlag{Name: "runtime", Value: siblingOr("detshare-runtime", defaultRuntimeBin), Usage: "detshare-runtime (runc wrapper) path"},
					&cli.StringFlag{Name: "shim", Value: siblingOr("containerd-shim-detshare-v1", defaultShimBin), Usage: "containerd-shim-detshare-v1 path (Docker ≥ 24)"},
				},
				Action: func(c *cli.Context) error {
					ver, err := engineVersion(c.String("docker-version"), "dockerd", "--docker-version")
					if err != nil {
						return err
					}
					bin, flag := c.String("runtime"), "--runtime"
					if ver[0] >= 24 {
						bin, flag = c.String("shim"), "--shim"
					}
					if err := checkExecutable(flag, bin); err != nil {
						return err
					}
					return applyEdit(c.App.Writer, c.String("config"), c.Bool("dry-run"), func(old []byte) ([]byte, error) {
						return dockerInstall(old, ver, c.String("runtime"), c.String("shim"))
					}, "restart Docker: systemctl restart docker; then docker run --runtime=detshare -e DETSHARE_TIER=burstable …")
				},
			},
			{
				Name:  "containerd",
				Usage: "add the detshare CRI runtime handler to containerd's configuration",
				Flags: []cli.Flag{dry,
					&cli.StringFlag{Name: "config", Value: defaultCtrdConfig, EnvVars: []string{"DETSHARE_CONTAINERD_CONFIG"}, Usage: "containerd config.toml"},
					&cli.StringFlag{Name: "drop-in", Value: defaultCtrdDropIn, EnvVars: []string{"DETSHARE_CONTAINERD_DROPIN"}, Usage: "drop-in file (config version 3)"},
					&cli.StringFlag{Name: "containerd-version", Value: "auto", Usage: "containerd version, used when the config does not say its version (auto: ask containerd --version)"},
					&cli.StringFlag{Name: "shim", Value: siblingOr("containerd-shim-detshare-v1", defaultShimBin), Usage: "containerd-shim-detshare-v1 path (runtime_path of the CRI handler)"},
					&cli.BoolFlag{Name: "pod-annotations", Usage: "also pass pods' detshare.io/* annotations to the handler (off: a pod's quota is its allocation, lowered only by its own DETSHARE_* environment)"},
				},
				Action: func(c *cli.Context) error {
					shim := c.String("shim")
					if err := checkExecutable("--shim", shim); err != nil {
						return err
					}
					if p, err := exec.LookPath("containerd-shim-detshare-v1"); err != nil || !sameFile(p, shim) {
						fmt.Fprintf(c.App.Writer, "note: %s is not the containerd-shim-detshare-v1 on this PATH: the CRI handler names it by path; for `ctr run --runtime %s` put %s on containerd's PATH\n",
							shim, installShimType, filepath.Dir(shim))
					}
					ver, err := containerdConfigVersion(c.String("config"), c.String("containerd-version"))
					if err != nil {
						return err
					}
					return containerdInstall(c.App.Writer, c.String("config"), c.String("drop-in"), ver,
						ctrdHandler{shim: shim, podAnnotations: c.Bool("pod-annotations")}, c.Bool("dry-run"))
				},
			},
		},
	}
}

func uninstallCommand() *cli.Command {
	flags := func() []cli.Flag {
		return []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "print what would be written and change nothing"},
			&cli.StringFlag{Name: "docker-config", Value: defaultDaemonJSON, EnvVars: []string{"DETSHARE_DOCKER_CONFIG"}, Usage: "Docker daemon.json"},
			&cli.StringFlag{Name: "containerd-config", Value: defaultCtrdConfig, EnvVars: []string{"DETSHARE_CONTAINERD_CONFIG"}, Usage: "containerd config.toml"},
			&cli.StringFlag{Name: "drop-in", Value: defaultCtrdDropIn, EnvVars: []string{"DETSHARE_CONTAINERD_DROPIN"}, Usage: "containerd 2.x drop-in to remove"},
		}
	}
	sub := func(what, usage string) *cli.Command {
		return &cli.Command{Name: what, Usage: usage, Flags: flags(),
			Action: func(c *cli.Context) error { return uninstall(c, what) }}
	}
	return &cli.Command{
		Name:  "uninstall",
		Usage: "remove the detshare runtime from Docker and/or containerd (default: both)",
		Flags: flags(),
		Subcommands: []*cli.Command{
			sub("docker", "remove runtimes.detshare from daemon.json"),
			sub("containerd", "remove the detshare runtime section (and the 2.x drop-in)"),
			sub("all", "both"),
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return fmt.Errorf("uninstall %q: allowed values are docker, containerd, all", c.Args().First())
			}
			return uninstall(c, "all")
		},
	}
}

func uninstall(c *cli.Context, what string) error {
	w, dry := c.App.Writer, c.Bool("dry-run")
	if what != "containerd" {
		const restart = "restart Docker: systemctl restart docker"
		p := c.String("docker-config")
		restored, err := restoreBackup(w, p, dry, dockerUninstall, sameContent, restart)
		if err != nil {
			return err
		}
		if !restored {
			if err := applyEditBackup(w, p, dry, false, dockerUninstall, restart); err != nil {
				return err
			}
			removeIfOurs(w, p, dry)
		}
	}
	if what == "docker" {
		return nil
	}
	drop := c.String("drop-in")
	strip := func(old []byte) ([]byte, error) { return containerdUninstall(old, drop) }
	const restart = "restart containerd: systemctl restart containerd"
	p := c.String("containerd-config")
	restored, err := restoreBackup(w, p, dry, strip, sameTOML, restart)
	if err != nil {
		return err
	}
	if !restored {
		if err := applyEditBackup(w, p, dry, false, strip, restart); err != nil {
			return err
		}
		removeIfOurs(w, p, dry)
	}
	if _, err := os.Stat(drop); err != nil {
		return nil
	}
	if dry {
		fmt.Fprintf(w, "would remove %s\n", drop)
		return nil
	}
	if err := os.Remove(drop); err != nil {
		return fmt.Errorf("remove drop-in: %w", err)
	}
	fmt.Fprintf(w, "removed %s\n", drop)
	return nil
}

// siblingOr is name next to the running detshare (installed or build/bin), else def.
func siblingOr(name, def string) string {
	if p := layout.Sibling(name); p != "" {
		return p
	}
	return def
}

// checkExecutable refuses to register a path that the engine could not run.
func checkExecutable(flag, p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s %q: must be an absolute path", flag, p)
	}
	if !layout.IsExecutable(p) {
		return fmt.Errorf("%s %s: not an executable file (install DetShare first: `make install` or the .deb); nothing was changed", flag, p)
	}
	return nil
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// containerdConfigVersion decides the config dialect: the existing config's `version` key (3: containerd 2.x
// schema, 2: containerd 1.x), else the containerd version (given or asked), 2.x → 3.
func containerdConfigVersion(config, given string) (int, error) {
	data, err := os.ReadFile(config)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("read %s: %w", config, err)
	}
	if len(bytes.TrimSpace(data)) > 0 {
		v, _, err := configVersion(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", config, err)
		}
		if v < 2 {
			return 0, fmt.Errorf("%s: config version %d: containerd 1.x needs version = 2 (version 1 names the CRI plugin \"cri\"), 2.x version = 3; migrate the file first (containerd config migrate)", config, v)
		}
		return v, nil
	}
	ver, err := engineVersion(given, "containerd", "--containerd-version")
	if err != nil {
		return 0, err
	}
	if ver[0] >= 2 {
		return 3, nil
	}
	return 2, nil
}

var versionRE = regexp.MustCompile(`\bv?(\d+)\.(\d+)`)

// engineVersion returns the major and minor version: given, or from `<bin> --version`.
func engineVersion(given, bin, flag string) ([2]int, error) {
	text := given
	if given == "auto" {
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			return [2]int{}, fmt.Errorf("cannot ask %s its version (%v): pass %s (for example 20.10 or 1.6)", bin, err, flag)
		}
		text = string(out)
	}
	m := versionRE.FindStringSubmatch(text)
	if m == nil {
		return [2]int{}, fmt.Errorf("%s %q: want a version such as 20.10, 24.0, 1.6 or 2.0", flag, given)
	}
	maj, _ := strconv.Atoi(m[1])
	min, _ := strconv.Atoi(m[2])
	return [2]int{maj, min}, nil
}

// applyEdit reads path (missing = empty), computes the new content, and writes it atomically after keeping a
// backup of the original (the first backup is never overwritten). Unchanged content writes nothing.
func applyEdit(w io.Writer, path string, dry bool, edit func([]byte) ([]byte, error), restart string) error {
	return applyEditBackup(w, path, dry, true, edit, restart)
}

// applyEditBackup is applyEdit; backup false (uninstall) keeps no copy of the file it edits.
func applyEditBackup(w io.Writer, path string, dry, backup bool, edit func([]byte) ([]byte, error), restart string) error {
	old, err := os.ReadFile(path)
	existed := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	updated, err := edit(old)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if bytes.Equal(old, updated) {
		fmt.Fprintf(w, "%s: already up to date, nothing changed\n", path)
		return nil
	}
	if dry {
		fmt.Fprintf(w, "--- %s would become:\n%s", path, updated)
		return nil
	}
	if existed && backup {
		if _, err := os.Stat(path + backupSuffix); errors.Is(err, os.ErrNotExist) {
			if err := writeAtomic(path+backupSuffix, old); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := writeAtomic(path, updated); err != nil {
		return err
	}
	switch {
	case existed && backup:
		fmt.Fprintf(w, "%s: updated (original kept as %s):\n", path, path+backupSuffix)
	case existed:
		fmt.Fprintf(w, "%s: updated:\n", path)
	default:
		fmt.Fprintf(w, "%s: created:\n", path)
	}
	for _, l := range lineDiff(old, updated) {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintln(w, restart)
	return nil
}

// sameContent: equal bytes, or equal JSON documents (daemon.json is re-encoded by the edit).
func sameContent(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// lineDiff lists the lines only in a ("- ") and only in b ("+ "), in file order: what an edit changed.
func lineDiff(a, b []byte) []string {
	count := func(d []byte) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(string(d), "\n") {
			m[l]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	var out []string
	for _, l := range strings.Split(string(a), "\n") {
		if cb[l] > 0 {
			cb[l]--
			continue
		}
		if strings.TrimSpace(l) != "" {
			out = append(out, "- "+l)
		}
	}
	cb = count(b)
	for _, l := range strings.Split(string(b), "\n") {
		if ca[l] > 0 {
			ca[l]--
			continue
		}
		if strings.TrimSpace(l) != "" {
			out = append(out, "+ "+l)
		}
	}
	return out
}

// restoreBackup gives path back byte for byte from the backup install kept (<path>.detshare-backup) when what is
// there now differs from it only by detshare's entries: strip removes them, same compares the result with the
// backup. The backup is then removed. When the administrator changed the file since (restored false), the caller
// removes only detshare's entries from the text as it is now.
func restoreBackup(w io.Writer, path string, dry bool, strip func([]byte) ([]byte, error), same func(a, b []byte) bool, restart string) (bool, error) {
	cur, err := os.ReadFile(path)
	if err != nil {
		return false, nil
	}
	bak, err := os.ReadFile(path + backupSuffix)
	if err != nil || bytes.Equal(cur, bak) {
		return false, nil // no backup, or nothing to restore (removeIfOurs drops an equal backup)
	}
	stripped, err := strip(cur)
	if err != nil || !same(stripped, bak) {
		return false, nil
	}
	if dry {
		fmt.Fprintf(w, "would restore %s byte for byte from %s\n", path, path+backupSuffix)
		return true, nil
	}
	if err := writeAtomic(path, bak); err != nil {
		return false, err
	}
	if err := os.Remove(path + backupSuffix); err != nil {
		return true, fmt.Errorf("remove %s: %w", path+backupSuffix, err)
	}
	fmt.Fprintf(w, "%s: restored byte for byte from %s (only detshare's entries had changed it); backup removed:\n", path, path+backupSuffix)
	for _, l := range lineDiff(cur, bak) {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintln(w, restart)
	return true, nil
}

// sameTOML: equal bytes, or equal TOML documents.
func sameTOML(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y map[string]any
	if _, err := toml.Decode(string(a), &x); err != nil {
		return false
	}
	if _, err := toml.Decode(string(b), &y); err != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// removeIfOurs finishes an uninstall: a file that detshare created (no backup) and that now holds nothing but a
// version line or an empty JSON object is removed; a backup equal to the restored file is removed.
func removeIfOurs(w io.Writer, path string, dry bool) {
	data, err := os.ReadFile(path)
	if err != nil || dry {
		return
	}
	backup, berr := os.ReadFile(path + backupSuffix)
	switch {
	case berr == nil && sameContent(backup, data):
		if os.Remove(path+backupSuffix) == nil {
			fmt.Fprintf(w, "removed %s (same as %s)\n", path+backupSuffix, path)
		}
	case errors.Is(berr, os.ErrNotExist):
		t := strings.TrimSpace(string(data))
		if t == "" || t == "{}" || t == "version = 2" || t == "version = 3" {
			if os.Remove(path) == nil {
				fmt.Fprintf(w, "removed %s (detshare had created it)\n", path)
			}
		}
	}
}

// ---- Docker ---------------------------------------------------------------------------------------------------------

func parseDaemonJSON(old []byte) (map[string]any, error) {
	m := map[string]any{}
	if len(bytes.TrimSpace(old)) == 0 {
		return m, nil
	}
	dec := json.NewDecoder(bytes.NewReader(old))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("not valid JSON (%v): fix it by hand first; nothing was changed", err)
	}
	return m, nil
}

// dockerInstall adds runtimes.detshare, keeping every other key.
func dockerInstall(old []byte, ver [2]int, runtimeBin, shimBin string) ([]byte, error) {
	for name, p := range map[string]string{"--runtime": runtimeBin, "--shim": shimBin} {
		if !filepath.IsAbs(p) {
			return nil, fmt.Errorf("%s %q: must be an absolute path", name, p)
		}
	}
	m, err := parseDaemonJSON(old)
	if err != nil {
		return nil, err
	}
	rts, ok := m["runtimes"].(map[string]any)
	if m["runtimes"] != nil && !ok {
		return nil, errors.New(`"runtimes" is not a JSON object; fix it by hand first`)
	}
	if rts == nil {
		rts = map[string]any{}
	}
	var entry map[string]any
	if ver[0] >= 24 {
		entry = map[string]any{"runtimeType": shimBin}
	} else {
		entry = map[string]any{"path": runtimeBin}
		if root, ok := m["data-root"].(string); ok && root != "" && root != "/var/lib/docker" {
			// The wrapper reads Docker labels from Docker's record of the container.
			entry["runtimeArgs"] = []any{"--detshare-docker-root", root}
		}
	}
	if cur, ok := rts[installRuntimeName]; ok {
		a, _ := json.Marshal(cur)
		b, _ := json.Marshal(entry)
		if bytes.Equal(a, b) {
			return old, nil
		}
	}
	// Edit the text, not a re-encoding: every other byte stays the administrator's (order, indentation), and
	// uninstall can remove exactly what this adds.
	text := string(old)
	if len(bytes.TrimSpace(old)) == 0 {
		text = "{}\n"
	}
	top, err := topObject(text)
	if err != nil {
		return nil, fmt.Errorf("not valid JSON (%v): fix it by hand first; nothing was changed", err)
	}
	unit := indentUnit(text, top)
	if i, ok := top.member("runtimes"); ok {
		j := jsonScanner{text}
		ro, err := j.object(top.members[i].valStart)
		if err != nil {
			return nil, errors.New(`"runtimes" is not a JSON object; fix it by hand first`)
		}
		text, err = withMember(text, ro, installRuntimeName, entry, unit)
		if err != nil {
			return nil, err
		}
	} else if text, err = withMember(text, top, "runtimes", map[string]any{installRuntimeName: entry}, unit); err != nil {
		return nil, err
	}
	if _, err := parseDaemonJSON([]byte(text)); err != nil {
		return nil, fmt.Errorf("the edited file would not parse (%v); nothing was changed", err)
	}
	return []byte(text), nil
}

// dockerUninstall removes runtimes.detshare (and runtimes when that leaves it empty, and a default-runtime naming
// detshare) from the text, leaving every other byte as it is.
func dockerUninstall(old []byte) ([]byte, error) {
	if len(old) == 0 {
		return old, nil
	}
	m, err := parseDaemonJSON(old)
	if err != nil {
		return nil, err
	}
	rts, _ := m["runtimes"].(map[string]any)
	_, ours := rts[installRuntimeName]
	if !ours && m["default-runtime"] != installRuntimeName {
		return old, nil
	}
	text := string(old)
	j := jsonScanner{text}
	if ours {
		top, err := topObject(text)
		if err != nil {
			return nil, err
		}
		i, _ := top.member("runtimes")
		ro, err := j.object(top.members[i].valStart)
		if err != nil {
			return nil, err
		}
		k, _ := ro.member(installRuntimeName)
		if len(ro.members) == 1 {
			text = withoutMember(text, top, i)
		} else {
			text = withoutMember(text, ro, k)
		}
	}
	if m["default-runtime"] == installRuntimeName {
		top, err := topObject(text)
		if err != nil {
			return nil, err
		}
		i, _ := top.member("default-runtime")
		text = withoutMember(text, top, i)
	}
	if _, err := parseDaemonJSON([]byte(text)); err != nil {
		return nil, fmt.Errorf("the edited file would not parse (%v); nothing was changed", err)
	}
	return []byte(text), nil
}

// ---- containerd -----------------------------------------------------------------------------------------------------

func criSection(version int) string {
	if version >= 3 {
		return `plugins."io.containerd.cri.v1.runtime".containerd.runtimes.` + installRuntimeName
	}
	return `plugins."io.containerd.grpc.v1.cri".containerd.runtimes.` + installRuntimeName
}

func runtimeBlock(version int) string {
	return runtimeBlockWith(version, "", ctrdHandler{shim: defaultShimBin})
}

// ctrdHandler is what the CRI handler install writes says: the shim's path and whether pods' annotations pass.
type ctrdHandler struct {
	shim           string
	podAnnotations bool
}

// annotations are the handler's annotation lines. Container annotations pass only the device plugin's ceiling
// (kubelet sets them; a pod cannot), and pod annotations, when passed at all, never include it.
func (h ctrdHandler) annotations() string {
	s := fmt.Sprintf("  container_annotations = [%q]\n", installAllocation)
	if h.podAnnotations {
		s = fmt.Sprintf("  pod_annotations = [%q]\n", installAnnotations) + s
	}
	return s
}

// runtimeBlockWith is the marked section; defaultRuntime, when not empty, also defines that runtime as runc's. A
// config that names any runtime under containerd.runtimes loses containerd's built-in "runc" entry, and the CRI
// plugin then refuses to load ("no corresponding runtime configured … default_runtime_name"): Debian's stock
// config.toml is such a file.
func runtimeBlockWith(version int, defaultRuntime string, h ctrdHandler) string {
	extra := ""
	if defaultRuntime != "" {
		sec := strings.TrimSuffix(criSection(version), installRuntimeName) + defaultRuntime
		extra = fmt.Sprintf("[%s]\n  runtime_type = \"io.containerd.runc.v2\"\n", sec)
	}
	return fmt.Sprintf("%s\n%s[%s]\n  runtime_type = %q\n  runtime_path = %q\n%s%s\n",
		beginMarker, extra, criSection(version), installShimType, h.shim, h.annotations(), endMarker)
}

// missingDefaultRuntime returns the CRI default runtime's name when the config does not define it (so adding a
// runtime would hide containerd's built-in definition), "" otherwise.
func missingDefaultRuntime(m map[string]any, plugin string) string {
	name := "runc"
	if n, ok := lookupPath(m, "plugins", plugin, "containerd", "default_runtime_name"); ok {
		if s, ok := n.(string); ok && s != "" {
			name = s
		}
	}
	if name == installRuntimeName {
		return ""
	}
	if _, ok := lookupPath(m, "plugins", plugin, "containerd", "runtimes", name); ok {
		return ""
	}
	return name
}

// configVersion reads the `version` key of a containerd config (1 when absent, as containerd does).
func configVersion(data []byte) (int, map[string]any, error) {
	var m map[string]any
	if _, err := toml.Decode(string(data), &m); err != nil {
		return 0, nil, fmt.Errorf("not valid TOML (%v): fix it by hand first; nothing was changed", err)
	}
	v := 1
	if n, ok := m["version"].(int64); ok {
		v = int(n)
	}
	return v, m, nil
}

// lookupPath walks a decoded TOML map.
var lookupPath = doctor.LookupTOML

// ctrdV2Install adds the marked runtime section to a containerd 1.x (config version 2) config.toml. A section from an
// earlier install is replaced, so the result is the same however often it runs.
func ctrdV2Install(old []byte, h ctrdHandler) ([]byte, error) {
	if len(bytes.TrimSpace(old)) == 0 {
		return []byte("version = 2\n\n" + runtimeBlockWith(2, "runc", h)), nil
	}
	base, err := ctrdRemoveBlock(old)
	if err != nil {
		return nil, err
	}
	v, m, err := configVersion(base)
	if err != nil {
		return nil, err
	}
	if v != 2 {
		return nil, fmt.Errorf("config version %d: containerd 1.x needs version = 2 (version 1 names the CRI plugin \"cri\"); migrate the file first", v)
	}
	if _, ok := lookupPath(m, "plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", installRuntimeName); ok {
		return nil, fmt.Errorf("[%s] already exists and was not written by detshare install: set runtime_type = %q and container_annotations = [%q] in it by hand, or remove it",
			criSection(2), installShimType, installAllocation)
	}
	out := append([]byte{}, base...)
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
		out = append(out, '\n')
	}
	out = append(out, '\n')
	out = append(out, runtimeBlockWith(2, missingDefaultRuntime(m, "io.containerd.grpc.v1.cri"), h)...)
	if bytes.Equal(out, old) {
		return old, nil
	}
	if _, _, err := configVersion(out); err != nil {
		return nil, fmt.Errorf("the edited file would not parse (%v); nothing was changed", err)
	}
	return out, nil
}

// ctrdRemoveBlock removes the marked section and the blank line install put before it.
func ctrdRemoveBlock(data []byte) ([]byte, error) {
	s := string(data)
	i := strings.Index(s, beginMarker)
	if i < 0 {
		return data, nil
	}
	j := strings.Index(s[i:], endMarker)
	if j < 0 {
		return nil, fmt.Errorf("found %q without %q: remove the detshare section by hand", beginMarker, endMarker)
	}
	end := i + j + len(endMarker)
	if end < len(s) && s[end] == '\n' {
		end++
	}
	// install adds one blank line before the section: take that one, keep the administrator's own.
	head := s[:i]
	if strings.HasSuffix(head, "\n\n") {
		head = head[:len(head)-1]
	} else if head == "\n" {
		head = ""
	}
	return []byte(head + s[end:]), nil
}

// containerdUninstall removes the marked section and, from a version-3 config, the imports entry naming the drop-in
// (containerd 2.x refuses to start when an imported file is missing).
func containerdUninstall(old []byte, dropIn string) ([]byte, error) {
	out, err := ctrdRemoveBlock(old)
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return out, err
	}
	v, m, err := configVersion(out)
	if err != nil || v != 3 {
		return out, nil
	}
	raw, _ := m["imports"].([]any)
	var keep []string
	found := false
	for _, x := range raw {
		if s, ok := x.(string); ok {
			if s == dropIn {
				found = true
				continue
			}
			keep = append(keep, strconv.Quote(s))
		}
	}
	if !found {
		return out, nil
	}
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "imports") && strings.Contains(l, dropIn) {
			if len(keep) == 0 {
				lines = append(lines[:i], lines[i+1:]...)
			} else {
				lines[i] = "imports = [" + strings.Join(keep, ", ") + "]"
			}
			break
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// ctrdImports adds path to the top-level imports of a version-3 config (creating the file when missing).
func ctrdImports(old []byte, path string) ([]byte, error) {
	if len(bytes.TrimSpace(old)) == 0 {
		return []byte(fmt.Sprintf("version = 3\nimports = [%q]\n", path)), nil
	}
	v, m, err := configVersion(old)
	if err != nil {
		return nil, err
	}
	if v != 3 {
		return nil, fmt.Errorf("config version %d: containerd 2.x uses version = 3; run `containerd config migrate` first", v)
	}
	var imports []string
	if raw, ok := m["imports"].([]any); ok {
		for _, x := range raw {
			if s, ok := x.(string); ok {
				imports = append(imports, s)
				if ok, _ := filepath.Match(s, path); ok || s == path {
					return old, nil
				}
			}
		}
	}
	imports = append(imports, path)
	quoted := make([]string, len(imports))
	for i, s := range imports {
		quoted[i] = strconv.Quote(s)
	}
	line := "imports = [" + strings.Join(quoted, ", ") + "]"
	lines := strings.Split(string(old), "\n")
	replaced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "imports") && strings.Contains(l, "=") && strings.Contains(l, "]") {
			lines[i], replaced = line, true
			break
		}
	}
	if !replaced { // top-level keys must precede the first table: put it right after `version`
		for i, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "version") {
				lines = append(lines[:i+1], append([]string{line}, lines[i+1:]...)...)
				replaced = true
				break
			}
		}
	}
	if !replaced {
		return nil, errors.New("cannot place an imports line (multi-line imports?): add the drop-in to imports by hand")
	}
	out := []byte(strings.Join(lines, "\n"))
	if _, _, err := configVersion(out); err != nil {
		return nil, fmt.Errorf("the edited file would not parse (%v); nothing was changed", err)
	}
	return out, nil
}

// containerdInstall registers the handler in a config of the given version (2: containerd 1.x, 3: 2.x).
func containerdInstall(w io.Writer, config, dropIn string, version int, h ctrdHandler, dry bool) error {
	const restart = "restart containerd: systemctl restart containerd; Kubernetes: apply configs/kubernetes/runtimeclass.yaml"
	if version < 3 {
		return applyEdit(w, config, dry, func(old []byte) ([]byte, error) { return ctrdV2Install(old, h) }, restart)
	}
	main, err := os.ReadFile(config)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", config, err)
	}
	var m map[string]any
	if _, err := toml.Decode(string(main), &m); err != nil {
		return fmt.Errorf("%s: not valid TOML (%v): fix it by hand first; nothing was changed", config, err)
	}
	def := missingDefaultRuntime(m, "io.containerd.cri.v1.runtime")
	if err := applyEdit(w, dropIn, dry, func(old []byte) ([]byte, error) {
		return []byte("version = 3\n\n" + runtimeBlockWith(3, def, h)), nil
	}, "(drop-in)"); err != nil {
		return err
	}
	return applyEdit(w, config, dry, func(old []byte) ([]byte, error) { return ctrdImports(old, dropIn) }, restart)
}

// writeAtomic replaces an engine configuration durably, keeping the mode of the file it replaces.
func writeAtomic(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	return atomicfile.Write(path, data, mode, true)
}
