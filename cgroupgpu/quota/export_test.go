package quota

// Resolves is how many times Inputs.Resolve has run in this test binary.
func Resolves() uint64 { return resolves.Load() }
