// Package quote quotes untrusted input for error messages and logs, bounded: tenant IDs, quota values and keys from
// annotations, labels and environment variables, quota-file lines. A tenant must not be able to make DetShare echo
// megabytes of its own text into a container engine's error, a hook's output or the host's logs (issue 13 item 7).
// Every place that quotes such input uses Q (or Bounded in a %s position), never %q on the raw value.
package quote

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Max is how many bytes of the input an error message shows.
const Max = 64

// Q returns s quoted as %q would, cut to its first Max bytes (at a character boundary) and followed by its total
// length when it was longer: "aaaa…"…(1048576 bytes).
func Q(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:cut(s)]) + fmt.Sprintf("…(%d bytes)", len(s))
}

// Bounded returns s unquoted when it is at most Max bytes, else its first Max bytes and its length (for messages
// that show the input without quotes).
func Bounded(s string) string {
	if len(s) <= Max {
		return s
	}
	return s[:cut(s)] + fmt.Sprintf("…(%d bytes)", len(s))
}

func cut(s string) int {
	n := Max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}
