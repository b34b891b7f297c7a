package testenv

import (
	"fmt"
	"unsafe"

	"github.com/detshare/detshare/internal/table"
)

// OwnTierScript is a shell command for a container started through DetShare (the workload image: busybox) that
// prints "tier=<n>", n the Tier in the container's own table slot (the slot its quota file names): the tier the
// library and the scheduler act on. The quota file does not carry the tier; the registration in the table does.
func OwnTierScript() string {
	off := table.ContainersOffset + int(unsafe.Offsetof(table.Container{}.Tier))
	return fmt.Sprintf(`slot=$(busybox sed -n 's/^slot=//p' %s); `+
		`echo "tier=$(busybox od -An -tu4 -j $((%d + slot * %d)) -N4 %s | busybox tr -d ' ')"`,
		table.ContainerQuotaPath, off, table.ContainerSize, table.ContainerTablePath)
}

// TierLine is what OwnTierScript prints for tier.
func TierLine(tier table.Tier) string { return fmt.Sprintf("tier=%d\n", uint32(tier)) }
