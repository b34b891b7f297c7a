# shellcheck shell=bash
# teardown.sh — what the demo and the fresh-host scripts share to leave nothing behind in a directory they own.
# Sourced, never run. Bash builtins only where processes are matched, so that no helper process of the loop names
# the directory itself.

# kill_naming DIR: SIGKILL every process (but this shell) whose command line names a path below DIR: shims, the
# scheduler and anything else only the caller started from there.
kill_naming() {
  local dir=$1 p args
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    args=()
    { mapfile -d '' -t args <"$p/cmdline"; } 2>/dev/null || continue
    case " ${args[*]} " in *"$dir/"*) kill -KILL "${p#/proc/}" 2>/dev/null ;; esac
  done
}

# umount_below DIR: lazily unmount DIR and every mount below it (rootfs overlays, shm), deepest first.
umount_below() {
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
}
