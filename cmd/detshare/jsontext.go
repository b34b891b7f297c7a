package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Text edits of daemon.json: install and uninstall add or remove one member of a JSON object and leave every other
// byte of the administrator's file as it was (key order, indentation, spacing), so that uninstall can give back the
// file as it found it. The scanner only locates spans; the documents are validated with encoding/json.

// jsonMember is one member of an object: start is its key's opening quote, valStart/end its value's span.
type jsonMember struct {
	key                  string
	start, valStart, end int
}

// jsonObject is an object's '{' and '}' offsets and members.
type jsonObject struct {
	open, close int
	members     []jsonMember
}

func (o jsonObject) member(key string) (int, bool) {
	for i, m := range o.members {
		if m.key == key {
			return i, true
		}
	}
	return -1, false
}

type jsonScanner struct{ s string }

func (j jsonScanner) ws(i int) int {
	for i < len(j.s) && strings.IndexByte(" \t\r\n", j.s[i]) >= 0 {
		i++
	}
	return i
}

func (j jsonScanner) str(i int) (int, error) {
	if i >= len(j.s) || j.s[i] != '"' {
		return 0, fmt.Errorf("offset %d: want a string", i)
	}
	for i++; i < len(j.s); i++ {
		switch j.s[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errors.New("unterminated string")
}

// value returns the end of the value at i (after leading whitespace).
func (j jsonScanner) value(i int) (int, error) {
	i = j.ws(i)
	if i >= len(j.s) {
		return 0, errors.New("unexpected end")
	}
	switch j.s[i] {
	case '"':
		return j.str(i)
	case '{':
		o, err := j.object(i)
		return o.close + 1, err
	case '[':
		i = j.ws(i + 1)
		if i < len(j.s) && j.s[i] == ']' {
			return i + 1, nil
		}
		for {
			e, err := j.value(i)
			if err != nil {
				return 0, err
			}
			i = j.ws(e)
			if i < len(j.s) && j.s[i] == ']' {
				return i + 1, nil
			}
			if i >= len(j.s) || j.s[i] != ',' {
				return 0, fmt.Errorf("offset %d: want , or ]", i)
			}
			i++
		}
	}
	e := i
	for e < len(j.s) && strings.IndexByte(",}] \t\r\n", j.s[e]) < 0 {
		e++
	}
	return e, nil
}

// object scans the object whose '{' is at i.
func (j jsonScanner) object(i int) (jsonObject, error) {
	o := jsonObject{open: i}
	if i >= len(j.s) || j.s[i] != '{' {
		return o, fmt.Errorf("offset %d: want an object", i)
	}
	i = j.ws(i + 1)
	if i < len(j.s) && j.s[i] == '}' {
		o.close = i
		return o, nil
	}
	for {
		i = j.ws(i)
		ke, err := j.str(i)
		if err != nil {
			return o, err
		}
		var key string
		if err := json.Unmarshal([]byte(j.s[i:ke]), &key); err != nil {
			return o, err
		}
		c := j.ws(ke)
		if c >= len(j.s) || j.s[c] != ':' {
			return o, fmt.Errorf("offset %d: want :", c)
		}
		vs := j.ws(c + 1)
		ve, err := j.value(vs)
		if err != nil {
			return o, err
		}
		o.members = append(o.members, jsonMember{key: key, start: i, valStart: vs, end: ve})
		i = j.ws(ve)
		if i < len(j.s) && j.s[i] == '}' {
			o.close = i
			return o, nil
		}
		if i >= len(j.s) || j.s[i] != ',' {
			return o, fmt.Errorf("offset %d: want , or }", i)
		}
		i++
	}
}

// topObject scans the document's top-level object.
func topObject(s string) (jsonObject, error) {
	j := jsonScanner{s}
	return j.object(j.ws(0))
}

// lineIndent is the whitespace from the start of the line holding offset i up to the first other character.
func lineIndent(s string, i int) string {
	b := strings.LastIndexByte(s[:i], '\n') + 1
	e := b
	for e < len(s) && (s[e] == ' ' || s[e] == '\t') {
		e++
	}
	return s[b:e]
}

// indentUnit guesses one level of the file's indentation from the top object's first member ("  " by default).
func indentUnit(s string, top jsonObject) string {
	if len(top.members) > 0 {
		if u := lineIndent(s, top.members[0].start); u != "" && strings.Contains(s[top.open:top.members[0].start], "\n") {
			return u
		}
	}
	return "  "
}

// withMember returns s with key: value (a Go value, encoded in the file's style) added to object o, or the existing
// member's value replaced.
func withMember(s string, o jsonObject, key string, value any, unit string) (string, error) {
	if i, ok := o.member(key); ok {
		m := o.members[i]
		v, err := json.MarshalIndent(value, lineIndent(s, m.start), unit)
		if err != nil {
			return "", err
		}
		return s[:m.valStart] + string(v) + s[m.end:], nil
	}
	k, _ := json.Marshal(key)
	if len(o.members) == 0 {
		outer := lineIndent(s, o.open)
		v, err := json.MarshalIndent(value, outer+unit, unit)
		if err != nil {
			return "", err
		}
		return s[:o.open+1] + "\n" + outer + unit + string(k) + ": " + string(v) + "\n" + outer + s[o.close:], nil
	}
	last := o.members[len(o.members)-1]
	if !strings.Contains(s[o.open:last.start], "\n") { // a one-line object stays on one line
		v, err := json.Marshal(value)
		if err != nil {
			return "", err
		}
		return s[:last.end] + ", " + string(k) + ": " + string(v) + s[last.end:], nil
	}
	ind := lineIndent(s, last.start)
	v, err := json.MarshalIndent(value, ind, unit)
	if err != nil {
		return "", err
	}
	return s[:last.end] + ",\n" + ind + string(k) + ": " + string(v) + s[last.end:], nil
}

// withoutMember returns s without member i of o, with the separator that came with it.
func withoutMember(s string, o jsonObject, i int) string {
	m := o.members[i]
	switch {
	case len(o.members) == 1:
		return s[:o.open+1] + s[o.close:]
	case i < len(o.members)-1:
		return s[:m.start] + s[o.members[i+1].start:]
	default:
		return s[:o.members[i-1].end] + s[m.end:]
	}
}
