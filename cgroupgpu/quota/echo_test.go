package quota

import (
	"strings"
	"testing"

	"github.com/detshare/detshare/internal/quote"
	"github.com/detshare/detshare/internal/table"
)

// TestErrorsEchoAttackerInputBounded is issue 13 item 7 (error echo): every quota key set to 1 MiB of garbage, from
// annotations, labels, the environment and `detshare run` flags, plus a 1 MiB unknown field, a 1 MiB tenant ID and a
// 1 MiB quota-file line. Each error still names the key and shows the start of the value, but no message grows with
// the input.
func TestErrorsEchoAttackerInputBounded(t *testing.T) {
	huge := strings.Repeat("X", 1<<20)
	fields := []Field{FieldTier, FieldSMs, FieldMemory, FieldWeight, FieldRole, FieldGPU, FieldLend}
	ann, lab, flags := map[string]string{}, map[string]string{}, map[Field]string{}
	var env []string
	for _, f := range fields {
		ann[f.AnnotationKey()] = huge
		lab[f.AnnotationKey()] = huge
		env = append(env, f.EnvKey()+"="+huge)
		flags[f] = huge
	}
	flags[Field(huge)] = "1"
	bound := func(what string, err error, perField int) {
		t.Helper()
		boundN(t, what, err, perField, "(1048576 bytes)")
	}
	_, err := Resolve(ann, lab, env, Default())
	bound("annotations", err, len(fields)*(quote.Max+400))
	_, err = Resolve(nil, lab, nil, Default())
	bound("labels", err, len(fields)*(quote.Max+400))
	_, err = Resolve(nil, nil, env, Default())
	bound("env", err, len(fields)*(quote.Max+400))
	_, err = ResolveInputs(Inputs{Flags: flags})
	bound("flags", err, (len(fields)+1)*(quote.Max+400))
	bound("tenant id", table.ValidateID(huge), quote.Max+200)
	// quota-file lines are read by a bufio.Scanner (64 KiB at most): 40000 bytes
	line := huge[:40000]
	_, err = ParseFile([]byte("version=1\n" + line + "\n"))
	boundN(t, "quota file line", err, quote.Max+200, "(40000 bytes)")
	_, err = ParseFile([]byte("version=1\nslot=" + line + "\n"))
	boundN(t, "quota file value", err, quote.Max+300, "(40000 bytes)")
}

func boundN(t *testing.T, what string, err error, max int, length string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted garbage", what)
	}
	if msg := err.Error(); len(msg) > max {
		t.Errorf("%s: error of %d bytes (bound %d): %.300s…", what, len(msg), max, msg)
	} else if !strings.Contains(msg, "XXXX") || !strings.Contains(msg, length) {
		t.Errorf("%s: error does not show the start and the length %s of the input: %s", what, length, msg)
	}
}
