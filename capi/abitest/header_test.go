//go:build linux

package abitest

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// prototype is a C function declaration reduced to types: return type and parameter types,
// without names, "const" or whitespace.
type prototype struct {
	ret    string
	params []string
	raw    string
}

func (p prototype) signature() string {
	return p.ret + "(" + strings.Join(p.params, ", ") + ")"
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	lineComment  = regexp.MustCompile(`//[^\n]*`)
	publicProto  = regexp.MustCompile(`CN_EXTERN[ \t]+([\w \t*]*?)\b(cn_\w+)\s*\(([^)]*)\)\s*;`)
	cgoProto     = regexp.MustCompile(`extern[ \t]+([\w \t*]*?)\b(cngo_\w+)\s*\(([^)]*)\)\s*;`)
	paramName    = regexp.MustCompile(`^(.*?[\s*])([A-Za-z_]\w*)$`)
	constWord    = regexp.MustCompile(`\bconst\b`)
	spaces       = regexp.MustCompile(`\s+`)
)

// normType drops "const" and whitespace: "const char *" -> "char*".
func normType(s string) string {
	return spaces.ReplaceAllString(constWord.ReplaceAllString(s, ""), "")
}

// parsePrototypes reads the declarations that re matches (groups: return type, name, params).
// closureToUintptr maps a "void *<...closure>" parameter to uintptr_t, as wrappers.c passes it.
func parsePrototypes(t *testing.T, file string, re *regexp.Regexp, closureToUintptr bool) map[string][]prototype {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (build it first: make lib)", err)
	}
	text := lineComment.ReplaceAllString(blockComment.ReplaceAllString(string(src), " "), " ")
	out := map[string][]prototype{}
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		p := prototype{ret: normType(m[1]), raw: spaces.ReplaceAllString(strings.TrimSpace(m[0]), " ")}
		params := strings.TrimSpace(m[3])
		if params != "void" && params != "" {
			for _, param := range strings.Split(params, ",") {
				param = strings.TrimSpace(param)
				pm := paramName.FindStringSubmatch(param)
				if pm == nil {
					t.Errorf("%s: cannot read parameter %q of %s", filepath.Base(file), param, m[2])
					continue
				}
				typ := normType(pm[1])
				if closureToUintptr && typ == "void*" && strings.HasSuffix(pm[2], "closure") {
					typ = "uintptr_t"
				}
				p.params = append(p.params, typ)
			}
		}
		out[m[2]] = append(out[m[2]], p)
	}
	return out
}

// The public header and the Go implementation agree: every cngo_X of the cgo-generated header
// has exactly one cn_X in include/channels_nats.h with the same types, and every cn_ function
// but the four accessors has its cngo_ implementation.
func TestHeaderConsistency(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	public := parsePrototypes(t, filepath.Join(root, "include", "channels_nats.h"), publicProto, true)
	cgo := parsePrototypes(t, filepath.Join(root, "build", runtime.GOOS+"-"+runtime.GOARCH, "cgo", "libchannels_nats.h"), cgoProto, false)
	if len(public) < 10 || len(cgo) < 10 {
		t.Fatalf("parsed %d public and %d cgo prototypes; the parser no longer matches the headers", len(public), len(cgo))
	}
	var drift []string
	names := make([]string, 0, len(cgo))
	for n := range cgo {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, goName := range names {
		impl := cgo[goName]
		cName := "cn_" + strings.TrimPrefix(goName, "cngo_")
		decl := public[cName]
		switch {
		case len(impl) != 1:
			drift = append(drift, goName+": declared "+strconv.Itoa(len(impl))+" times in the cgo header")
		case len(decl) != 1:
			drift = append(drift, goName+": "+strconv.Itoa(len(decl))+" declarations of "+cName+" in include/channels_nats.h, want exactly 1")
		case decl[0].signature() != impl[0].signature():
			drift = append(drift, cName+" and "+goName+" differ:\n"+
				"    public: "+decl[0].signature()+"\n        from "+decl[0].raw+"\n"+
				"    cgo:    "+impl[0].signature()+"\n        from "+impl[0].raw)
		}
	}
	accessors := map[string]bool{"cn_version": true, "cn_status_text": true, "cn_last_error": true, "cn_free": true}
	for cName, decls := range public {
		if len(decls) != 1 {
			drift = append(drift, cName+": declared "+strconv.Itoa(len(decls))+" times in include/channels_nats.h")
		}
		goName := "cngo_" + strings.TrimPrefix(cName, "cn_")
		if !accessors[cName] && cgo[goName] == nil {
			drift = append(drift, cName+": no "+goName+" in the cgo header (no Go implementation exported)")
		}
		if accessors[cName] && cgo[goName] != nil {
			drift = append(drift, cName+": an accessor of wrappers.c, but "+goName+" exists too")
		}
		if !accessors[cName] && len(decls) == 1 && decls[0].ret != "cn_status" {
			drift = append(drift, cName+": returns "+decls[0].ret+", but every function except the accessors and cn_free returns cn_status")
		}
	}
	for a := range accessors {
		if public[a] == nil {
			drift = append(drift, a+": missing from include/channels_nats.h")
		}
	}
	sort.Strings(drift)
	if len(drift) > 0 {
		t.Errorf("include/channels_nats.h and the cgo header drifted apart (rebuild with make lib if the Go side changed):\n  %s",
			strings.Join(drift, "\n  "))
	}
}
