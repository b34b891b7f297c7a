package shimv2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// ContainerdLabels reads a container's labels from containerd's containers API at address (the shim's -address):
// one unary call of containerd.services.containers.v1.Containers/Get over the daemon's gRPC socket.
//
// The call is made with the few lines of HTTP/2 and protobuf it needs (labelCall) rather than with grpc-go: the shim
// binary is executed three times per container (start, the shim itself, delete), and linking grpc-go (with net/http,
// crypto/tls, html/template behind it) cost every one of those process starts ~1 ms of CPU in package
// initialisation and a third more binary to fault in (BENCHMARKS.md, issue 28, 2026-11-27).
func ContainerdLabels(address, namespace string) LabelFunc {
	return func(ctx context.Context, id string) (map[string]string, error) {
		if address == "" {
			return nil, errors.New("no containerd address given to the shim")
		}
		labels, err := labelCall(ctx, address, namespace, id)
		if err != nil {
			return nil, fmt.Errorf("get container %s from containerd at %s: %w", id, address, err)
		}
		return labels, nil
	}
}

// containersGet is the gRPC method labelCall calls.
const containersGet = "/containerd.services.containers.v1.Containers/Get"

// HTTP/2 frame types and flags (RFC 9113 section 6) that labelCall uses.
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	// Large receive windows so that the server never waits for a WINDOW_UPDATE: a container record carries its
	// whole OCI spec.
	recvWindow = 1 << 30
	// maxResponse bounds what is read from the daemon.
	maxResponse = 64 << 20
)

// StatusError is a non-OK gRPC status returned by containerd.
type StatusError struct {
	Code    int // gRPC status code (5: not found)
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("grpc status %d: %s", e.Code, e.Message)
}

// labelCall performs Containers/Get(id) in namespace on a new connection to the gRPC socket at address (a unix
// socket path) and returns the container's labels.
func labelCall(ctx context.Context, address, namespace, id string) (map[string]string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", address)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// The context ends the call (and only it: ctx.Err() then tells why the read failed).
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	msg, err := unaryCall(conn, namespace, containersGet, protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), id))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	return decodeLabels(msg)
}

// unaryCall sends one gRPC request (req, the serialised message) on a fresh HTTP/2 connection and returns the
// serialised response message.
func unaryCall(conn io.ReadWriter, namespace, method string, req []byte) ([]byte, error) {
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		{"containerd-namespace", namespace}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return nil, err
		}
	}
	body := make([]byte, 5, 5+len(req)) // gRPC message prefix: not compressed, big-endian length
	binary.BigEndian.PutUint32(body[1:], uint32(len(req)))
	body = append(body, req...)

	w := bufio.NewWriter(conn)
	w.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	settings := make([]byte, 6)
	binary.BigEndian.PutUint16(settings, 0x4) // SETTINGS_INITIAL_WINDOW_SIZE
	binary.BigEndian.PutUint32(settings[2:], recvWindow)
	writeFrame(w, frameSettings, 0, 0, settings)
	writeFrame(w, frameWindowUpdate, 0, 0, binary.BigEndian.AppendUint32(nil, recvWindow-65535))
	writeFrame(w, frameHeaders, flagEndHeaders, 1, hdr.Bytes())
	writeFrame(w, frameData, flagEndStream, 1, body)
	if err := w.Flush(); err != nil {
		return nil, err
	}

	r := bufio.NewReader(conn)
	var (
		data     []byte
		headers  []hpack.HeaderField
		block    []byte // a header block being continued
		total    int
		grpcCode = -1
		grpcMsg  string
	)
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) { headers = append(headers, f) })
	var fh [9]byte
	for {
		if _, err := io.ReadFull(r, fh[:]); err != nil {
			return nil, fmt.Errorf("read response: %w", err)
		}
		n := int(fh[0])<<16 | int(fh[1])<<8 | int(fh[2])
		typ, flags, stream := fh[3], fh[4], binary.BigEndian.Uint32(fh[5:])&0x7fffffff
		if total += n; total > maxResponse {
			return nil, fmt.Errorf("response larger than %d bytes", maxResponse)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return nil, fmt.Errorf("read response: %w", err)
		}
		switch typ {
		case frameSettings:
			if flags&flagAck == 0 {
				writeFrame(w, frameSettings, flagAck, 0, nil)
			}
		case framePing:
			if flags&flagAck == 0 {
				writeFrame(w, framePing, flagAck, 0, payload)
			}
		case frameGoAway:
			if len(payload) >= 8 {
				return nil, fmt.Errorf("connection refused by the daemon (GOAWAY code %d: %s)",
					binary.BigEndian.Uint32(payload[4:8]), payload[8:])
			}
			return nil, errors.New("connection refused by the daemon (GOAWAY)")
		case frameRSTStream:
			if stream == 1 {
				return nil, fmt.Errorf("request reset by the daemon (RST_STREAM code %d)", binary.BigEndian.Uint32(append(payload, 0, 0, 0, 0)))
			}
		case frameData:
			if stream != 1 {
				continue
			}
			p, err := unpad(flags, payload)
			if err != nil {
				return nil, err
			}
			data = append(data, p...)
		case frameHeaders, frameContinuation:
			if stream != 1 {
				continue
			}
			p := payload
			if typ == frameHeaders {
				var err error
				if p, err = unpad(flags, payload); err != nil {
					return nil, err
				}
				if flags&flagPriority != 0 {
					if len(p) < 5 {
						return nil, errors.New("malformed HEADERS frame")
					}
					p = p[5:]
				}
			}
			block = append(block, p...)
			if flags&flagEndHeaders == 0 {
				continue
			}
			headers = headers[:0]
			if _, err := dec.Write(block); err != nil {
				return nil, fmt.Errorf("response headers: %w", err)
			}
			block = nil
			for _, f := range headers {
				switch f.Name {
				case ":status":
					if f.Value != "200" {
						return nil, fmt.Errorf("HTTP status %s", f.Value)
					}
				case "grpc-status":
					c, err := strconv.Atoi(f.Value)
					if err != nil {
						return nil, fmt.Errorf("grpc-status %q", f.Value)
					}
					grpcCode = c
				case "grpc-message":
					if m, err := url.PathUnescape(f.Value); err == nil {
						grpcMsg = m
					} else {
						grpcMsg = f.Value
					}
				}
			}
		}
		if err := w.Flush(); err != nil {
			return nil, err
		}
		if stream == 1 && flags&flagEndStream != 0 && (typ == frameData || typ == frameHeaders) {
			break
		}
	}
	if grpcCode != 0 {
		if grpcCode < 0 {
			return nil, errors.New("response without grpc-status")
		}
		return nil, &StatusError{Code: grpcCode, Message: grpcMsg}
	}
	if len(data) < 5 {
		return nil, errors.New("response without a message")
	}
	if data[0] != 0 {
		return nil, errors.New("compressed response message (none was asked for)")
	}
	if l := binary.BigEndian.Uint32(data[1:5]); int(l) != len(data)-5 {
		return nil, fmt.Errorf("response message of %d bytes announced, %d received", l, len(data)-5)
	}
	return data[5:], nil
}

func writeFrame(w *bufio.Writer, typ, flags byte, stream uint32, payload []byte) {
	var h [9]byte
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3], h[4] = typ, flags
	binary.BigEndian.PutUint32(h[5:], stream)
	w.Write(h[:])
	w.Write(payload)
}

// unpad strips a PADDED frame's padding.
func unpad(flags byte, p []byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, errors.New("malformed padded frame")
	}
	return p[1 : len(p)-int(p[0])], nil
}

// decodeLabels reads the labels (field 2, map<string,string>) of the Container (field 1) of a GetContainerResponse.
func decodeLabels(msg []byte) (map[string]string, error) {
	labels := map[string]string{}
	container, found, err := bytesField(msg, 1)
	if err != nil || !found {
		if err == nil {
			err = errors.New("no container in the response")
		}
		return nil, fmt.Errorf("GetContainerResponse: %w", err)
	}
	for b := container; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("Container: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num != 2 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, fmt.Errorf("Container: %w", protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		entry, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, fmt.Errorf("Container.labels: %w", protowire.ParseError(n))
		}
		b = b[n:]
		k, _, err := bytesField(entry, 1)
		if err != nil {
			return nil, fmt.Errorf("Container.labels: %w", err)
		}
		v, _, err := bytesField(entry, 2)
		if err != nil {
			return nil, fmt.Errorf("Container.labels: %w", err)
		}
		labels[string(k)] = string(v)
	}
	return labels, nil
}

// bytesField returns the last occurrence of length-delimited field num in msg.
func bytesField(msg []byte, num protowire.Number) (v []byte, found bool, err error) {
	for len(msg) > 0 {
		n0, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		msg = msg[n:]
		if n0 == num && typ == protowire.BytesType {
			b, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, false, protowire.ParseError(n)
			}
			v, found = b, true
			msg = msg[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(n0, typ, msg); n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		msg = msg[n:]
	}
	return v, found, nil
}
