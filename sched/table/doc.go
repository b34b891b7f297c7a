// Package table is the Go side of DetShare's host-wide shared-memory table. The binary layout is defined once, in
// detshare_table.h; this package mirrors it and its tests fail when the two disagree.
package table

// ABIVersion is DS_TABLE_ABI_VERSION from detshare_table.h.
const ABIVersion = 1
