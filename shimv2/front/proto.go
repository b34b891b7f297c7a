package front

import (
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// runcOptionsName is the protobuf name of containerd's runc options (containerd.runc.v1.Options), the one type of
// runtime options containerd's runc manager reads the shim cgroup from.
const runcOptionsName = "containerd.runc.v1.Options"

// Field numbers of the messages decoded and encoded by hand (google.protobuf.Any, containerd.runc.v1.Options,
// containerd.task.v2.DeleteResponse, google.protobuf.Timestamp); the tests check them against the real types.
const (
	anyTypeURL, anyValue              = 1, 2
	optionsShimCgroup                 = 3
	deletePid, deleteStatus, deleteAt = 1, 2, 3
	timestampSeconds, timestampNanos  = 1, 2
)

// ShimCgroup returns the ShimCgroup of the runtime options containerd passes to `start` on stdin (a protobuf Any);
// ok is false when data is not an Any holding containerd.runc.v1.Options (containerd's manager then joins no
// cgroup).
func ShimCgroup(data []byte) (cg string, ok bool) {
	var typeURL string
	var value []byte
	if !eachField(data, func(num protowire.Number, typ protowire.Type, v []byte) {
		if typ != protowire.BytesType {
			return
		}
		switch num {
		case anyTypeURL:
			typeURL = string(v)
		case anyValue:
			value = v
		}
	}) {
		return "", false
	}
	if typeURL[strings.LastIndexByte(typeURL, '/')+1:] != runcOptionsName {
		return "", false
	}
	if !eachField(value, func(num protowire.Number, typ protowire.Type, v []byte) {
		if num == optionsShimCgroup && typ == protowire.BytesType {
			cg = string(v)
		}
	}) {
		return "", false
	}
	return cg, true
}

// eachField calls f for every field of the protobuf message b (v is the payload of length-delimited fields);
// false when b is malformed.
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte)) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return false
		}
		f(num, typ, v)
		b = b[n:]
	}
	return true
}

// DeleteResponse encodes containerd.task.v2.DeleteResponse, what the `delete` action writes on stdout (proto3:
// zero fields are left out, as proto.Marshal leaves them).
func DeleteResponse(pid, exitStatus int, exitedAt time.Time) []byte {
	var b []byte
	if uint32(pid) != 0 {
		b = protowire.AppendTag(b, deletePid, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(uint32(pid)))
	}
	if uint32(exitStatus) != 0 {
		b = protowire.AppendTag(b, deleteStatus, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(uint32(exitStatus)))
	}
	var ts []byte
	if s := exitedAt.Unix(); s != 0 {
		ts = protowire.AppendTag(ts, timestampSeconds, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(s))
	}
	if ns := int32(exitedAt.Nanosecond()); ns != 0 {
		ts = protowire.AppendTag(ts, timestampNanos, protowire.VarintType)
		ts = protowire.AppendVarint(ts, uint64(int64(ns)))
	}
	b = protowire.AppendTag(b, deleteAt, protowire.BytesType)
	return protowire.AppendBytes(b, ts)
}
