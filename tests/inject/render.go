// Renders an Istio injection template the way istiod does, for tests/inject.rs: Go's
// text/template with sprig's functions, and Istio's own over them (istio/istio
// pkg/kube/inject/inject.go parseDryTemplate and runTemplate; template.go createInjectionFuncmap).
// Sprig is the real one, Debian's golang-github-masterminds-sprig-dev, built in GOPATH mode.
// Of Istio's functions the two the templates use are defined here with Istio's meaning
// (`annotation`, and `contains` with its arguments flipped); sprig's `indent`, `env` and `omit`,
// which Istio replaces with functions of other meanings, are removed, so a template using them
// fails here rather than render differently.
//
// The data holds the fields of istiod's SidecarTemplateData the templates read, with istiod's Go
// types, so that field access, nil pointers and sprig's conversions behave as there:
// ObjectMeta (metav1.ObjectMeta: Annotations), Spec (corev1.PodSpec: TerminationGracePeriodSeconds,
// a *int64, nil when the pod does not set it; Containers, each's Name and Lifecycle.PreStop),
// ProxyConfig (*meshconfig.ProxyConfig:
// TerminationDrainDuration, a *durationpb.Duration), NativeSidecars and Values. A template that
// reads any other field fails to render.
//
// Usage: render TEMPLATE_FILE CONTEXT_JSON
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
)

type objectMeta struct {
	Annotations map[string]string
}

// lifecycle and container hold corev1's fields the templates read: a hook is a pointer, nil
// when the container has none.
type lifecycle struct {
	PreStop *json.RawMessage `json:"preStop"`
}

type container struct {
	Name      string     `json:"name"`
	Lifecycle *lifecycle `json:"lifecycle"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int64      `json:"terminationGracePeriodSeconds"`
	Containers                    []container `json:"containers"`
}

// duration has durationpb.Duration's fields.
type duration struct {
	Seconds int64
	Nanos   int32
}

type proxyConfig struct {
	TerminationDrainDuration *duration
}

type data struct {
	ObjectMeta     objectMeta
	Spec           podSpec
	ProxyConfig    *proxyConfig
	NativeSidecars bool
	Values         map[string]interface{}
}

// annotation is Istio's: the pod's annotation, or the default printed as text.
func annotation(meta objectMeta, name string, def interface{}) string {
	if v, ok := meta.Annotations[name]; ok {
		return v
	}
	return fmt.Sprint(def)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: render TEMPLATE_FILE CONTEXT_JSON")
		os.Exit(2)
	}
	text, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var d data
	decoder := json.NewDecoder(strings.NewReader(os.Args[2]))
	if err := decoder.Decode(&d); err != nil {
		fmt.Fprintln(os.Stderr, "context:", err)
		os.Exit(1)
	}
	funcs := sprig.TxtFuncMap()
	for _, replaced := range []string{"indent", "env", "omit"} {
		delete(funcs, replaced)
	}
	funcs["annotation"] = annotation
	funcs["contains"] = func(needle, haystack string) bool { return strings.Contains(haystack, needle) }
	t, err := template.New("inject").Funcs(funcs).Parse(string(text))
	if err != nil {
		fmt.Fprintln(os.Stderr, "template:", err)
		os.Exit(1)
	}
	if err := t.Execute(os.Stdout, &d); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
