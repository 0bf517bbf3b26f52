// history-check: checks histories of revstore pages for linearizability
// against the page contract, with porcupine (github.com/anishathalye/porcupine).
//
// The model, per page: the renders stored (each a version: revision, render
// time, tid, body hash), the revision the page is deleted through (its
// fence) and the revisions suppressed. A render is visible when its
// revision is above the fence and not suppressed; a read of the latest
// returns the highest visible version, a read by revision the highest
// visible version of that revision, a read by tid that version if visible.
// A deletion is through the revision it names (a fence never moves back);
// one that names none is through the newest held; a suppression removes the revision's renders (a lift hides them no
// longer, but they are gone: reads of them fall back to old-store, which the
// model does not follow, so histories do not read a lifted revision's
// renders by tid).
// A write answered "stored" (201) is legal only if the revision is visible
// and no render with its (revision, tid) holds another body; one answered
// "refused" (409) only if it could not be kept. An operation with no answer
// may have taken effect or not, at any time after it was sent.
//
// Input: a JSON history on stdin (see Operation below). Output: one JSON line.
// Exit status: 0 linearizable, 1 not, 2 the check timed out or the input is bad.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Version of a render: precedence by revision, then render time (the tid's
// time, then the tid itself), and the body stored under it.
type Version struct {
	Rev   int64  `json:"rev"`
	Order int64  `json:"order"`
	Tid   string `json:"tid"`
	Body  string `json:"body"`
}

func (v Version) before(o Version) bool {
	if v.Rev != o.Rev {
		return v.Rev < o.Rev
	}
	if v.Order != o.Order {
		return v.Order < o.Order
	}
	return v.Tid < o.Tid
}

// Input of an operation.
type Input struct {
	// write, delete, suppress, lift, read_latest, read_rev, read_tid
	Kind    string   `json:"kind"`
	Version *Version `json:"version,omitempty"`
	Rev     int64    `json:"rev,omitempty"`
}

// Output of an operation.
type Output struct {
	// stored, refused, done, unknown (writes, deletes, suppressions, lifts); read
	Status string `json:"status"`
	// What a read returned: a version, or null for none (404).
	Found *Version `json:"found,omitempty"`
}

// Operation as the history file holds it.
type Operation struct {
	Client int    `json:"client"`
	Page   string `json:"page"`
	Call   int64  `json:"call"`
	// null: no answer came back (it may take effect any time after the call)
	Return *int64 `json:"return"`
	Input  Input  `json:"input"`
	Output Output `json:"output"`
}

type state struct {
	stored     []Version // sorted by precedence
	fence      int64
	suppressed []int64 // sorted
}

func (s state) key() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d|", s.fence)
	for _, r := range s.suppressed {
		fmt.Fprintf(&b, "%d,", r)
	}
	b.WriteString("|")
	for _, v := range s.stored {
		fmt.Fprintf(&b, "%d/%d/%s/%s;", v.Rev, v.Order, v.Tid, v.Body)
	}
	return b.String()
}

func (s state) hidden(rev int64) bool {
	if rev <= s.fence {
		return true
	}
	i := sort.Search(len(s.suppressed), func(i int) bool { return s.suppressed[i] >= rev })
	return i < len(s.suppressed) && s.suppressed[i] == rev
}

// The highest visible version for which keep is true.
func (s state) latest(keep func(Version) bool) *Version {
	for i := len(s.stored) - 1; i >= 0; i-- {
		v := s.stored[i]
		if !s.hidden(v.Rev) && keep(v) {
			return &v
		}
	}
	return nil
}

func (s state) with(v Version) state {
	for _, o := range s.stored {
		if o == v {
			return s
		}
	}
	stored := append(append([]Version{}, s.stored...), v)
	sort.Slice(stored, func(i, j int) bool { return stored[i].before(stored[j]) })
	return state{stored, s.fence, s.suppressed}
}

// Whether a render with v's (revision, tid) holds another body.
func (s state) conflicts(v Version) bool {
	for _, o := range s.stored {
		if o.Rev == v.Rev && o.Tid == v.Tid && o.Body != v.Body {
			return true
		}
	}
	return false
}

func (s state) suppressing(rev int64, hide bool) state {
	var out []int64
	for _, r := range s.suppressed {
		if r != rev {
			out = append(out, r)
		}
	}
	if hide {
		out = append(out, rev)
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	}
	return state{s.stored, s.fence, out}
}

func sameVersion(a, b *Version) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// step: the states an operation can lead to from s (none: illegal here).
func step(s state, in Input, out Output) []state {
	unknown := out.Status == "unknown"
	switch in.Kind {
	case "write":
		v := *in.Version
		keepable := !s.hidden(v.Rev) && !s.conflicts(v)
		switch {
		case unknown:
			if keepable {
				return []state{s, s.with(v)}
			}
			return []state{s}
		case out.Status == "stored" && keepable:
			return []state{s.with(v)}
		case out.Status == "refused" && !keepable:
			return []state{s}
		}
		return nil
	case "delete", "suppress", "lift":
		var next state
		switch in.Kind {
		case "delete":
			// Through the revision named; without one, through the newest
			// held (as current-store deletes). A fence never moves back.
			next = state{s.stored, s.fence, s.suppressed}
			if in.Rev == 0 {
				for _, v := range s.stored {
					if v.Rev > next.fence {
						next.fence = v.Rev
					}
				}
			}
			if in.Rev > next.fence {
				next.fence = in.Rev
			}
		case "suppress":
			// The revision's renders are removed: a lift does not bring
			// them back (a read of the revision then falls back to old-store).
			next = s.suppressing(in.Rev, true)
			var kept []Version
			for _, v := range next.stored {
				if v.Rev != in.Rev {
					kept = append(kept, v)
				}
			}
			next.stored = kept
		default:
			next = s.suppressing(in.Rev, false)
		}
		switch out.Status {
		case "unknown":
			return []state{s, next}
		case "done":
			return []state{next}
		}
		return nil
	case "read_latest":
		if sameVersion(out.Found, s.latest(func(Version) bool { return true })) {
			return []state{s}
		}
		return nil
	case "read_rev":
		if sameVersion(out.Found, s.latest(func(v Version) bool { return v.Rev == in.Rev })) {
			return []state{s}
		}
		return nil
	case "read_tid":
		want := *in.Version
		found := s.latest(func(v Version) bool { return v.Rev == want.Rev && v.Tid == want.Tid })
		if sameVersion(out.Found, found) {
			return []state{s}
		}
		return nil
	}
	return nil
}

func model() porcupine.Model {
	nondeterministic := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byPage := map[string][]porcupine.Operation{}
			var pages []string
			for _, op := range history {
				page := op.Metadata.(string)
				if _, seen := byPage[page]; !seen {
					pages = append(pages, page)
				}
				byPage[page] = append(byPage[page], op)
			}
			var out [][]porcupine.Operation
			for _, page := range pages {
				out = append(out, byPage[page])
			}
			return out
		},
		Init: func() []interface{} { return []interface{}{state{}} },
		Step: func(s, in, out interface{}) []interface{} {
			var next []interface{}
			for _, n := range step(s.(state), in.(Input), out.(Output)) {
				next = append(next, n)
			}
			return next
		},
		Equal: func(a, b interface{}) bool { return a.(state).key() == b.(state).key() },
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(Input), out.(Output)
			what := i.Kind
			if i.Version != nil {
				what += fmt.Sprintf(" %d/%s", i.Version.Rev, i.Version.Tid)
			} else if i.Rev != 0 {
				what += fmt.Sprintf(" %d", i.Rev)
			}
			if o.Found != nil {
				return fmt.Sprintf("%s -> %d/%s", what, o.Found.Rev, o.Found.Tid)
			}
			if o.Status == "read" {
				return what + " -> none"
			}
			return what + " -> " + o.Status
		},
	}
	return nondeterministic.ToModel()
}

func main() {
	timeout := flag.Duration("timeout", time.Minute, "how long the search may take")
	visualize := flag.String("visualize", "", "write porcupine's visualization of the history here")
	flag.Parse()
	var history struct {
		Operations []Operation `json:"operations"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&history); err != nil {
		fmt.Fprintf(os.Stderr, "history-check: the history does not parse: %v\n", err)
		os.Exit(2)
	}
	pages := map[string]bool{}
	var ops []porcupine.Operation
	for _, op := range history.Operations {
		if (op.Input.Kind == "write" || op.Input.Kind == "read_tid") && op.Input.Version == nil {
			fmt.Fprintf(os.Stderr, "history-check: a %s without a version\n", op.Input.Kind)
			os.Exit(2)
		}
		ret := int64(math.MaxInt64)
		if op.Return != nil {
			ret = *op.Return
		}
		pages[op.Page] = true
		ops = append(ops, porcupine.Operation{ClientId: op.Client, Input: op.Input, Call: op.Call, Output: op.Output, Return: ret, Metadata: op.Page})
	}
	result, info := porcupine.CheckOperationsVerbose(model(), ops, *timeout)
	if *visualize != "" {
		if err := porcupine.VisualizePath(model(), info, *visualize); err != nil {
			fmt.Fprintf(os.Stderr, "history-check: visualization: %v\n", err)
		}
	}
	summary, _ := json.Marshal(map[string]interface{}{"result": string(result), "pages": len(pages), "operations": len(ops)})
	fmt.Println(string(summary))
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
