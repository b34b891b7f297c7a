// Command order prints the runtime kind of every measured start of BenchmarkStartPaired, one per line in start order
// (0 runc, 1 DetShare's shim without a quota, 2 with the quota, 3 the reference shim): the benchmark draws its order
// from rand.NewSource(1), so it is the same in every run. shimexec/segments.py pairs it with a perf trace.
//
//	go run ./integration/containers/shimexec/order PAIRS KINDS   # KINDS: 3, or 4 with DETSHARE_BENCH_REF_SHIM
package main

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: order PAIRS KINDS (KINDS: 3, or 4 with DETSHARE_BENCH_REF_SHIM)")
		os.Exit(2)
	}
	pairs, err1 := strconv.Atoi(os.Args[1])
	kinds, err2 := strconv.Atoi(os.Args[2])
	if err1 != nil || err2 != nil || pairs < 1 || kinds < 3 || kinds > 4 {
		fmt.Fprintf(os.Stderr, "order: PAIRS must be a positive integer and KINDS 3 or 4, got %q %q\n", os.Args[1], os.Args[2])
		os.Exit(2)
	}
	// as BenchmarkStartPaired (integration/containers/startbench_test.go): one generator, a new permutation a round
	order := rand.New(rand.NewSource(1))
	for r := 0; r < pairs; r++ {
		for _, k := range order.Perm(kinds) {
			fmt.Println(k)
		}
	}
}
