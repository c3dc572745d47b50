// Renders an Istio injection template the way istiod does, with Go's text/template, for
// tests/inject.rs. istiod parses templates with sprig's functions and its own
// (istio/istio pkg/kube/inject/template.go); the templates under test use two of them, defined
// here with the same meaning: sprig's `default` and Istio's `annotation`.
//
// Usage: go run tests/inject/render.go TEMPLATE_FILE CONTEXT_JSON
// CONTEXT_JSON holds what istiod passes: ObjectMeta (with Annotations), NativeSidecars, Values.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"text/template"
)

// isEmpty is sprig's notion of an empty value, which `default` replaces.
func isEmpty(v interface{}) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return rv.Len() == 0
	case reflect.Bool:
		return !rv.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return rv.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return rv.Float() == 0
	case reflect.Ptr, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// dflt is sprig's `default`: the given value, or the default when the given one is empty.
func dflt(d interface{}, given ...interface{}) interface{} {
	if len(given) == 0 || isEmpty(given[0]) {
		return d
	}
	return given[0]
}

// annotation is Istio's: the pod's annotation, or the default printed as text.
func annotation(meta map[string]interface{}, name string, def interface{}) string {
	if annotations, ok := meta["Annotations"].(map[string]interface{}); ok {
		if v, ok := annotations[name]; ok {
			return fmt.Sprint(v)
		}
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
	var data map[string]interface{}
	if err := json.Unmarshal([]byte(os.Args[2]), &data); err != nil {
		fmt.Fprintln(os.Stderr, "context:", err)
		os.Exit(1)
	}
	funcs := template.FuncMap{"default": dflt, "annotation": annotation}
	t, err := template.New("inject").Funcs(funcs).Parse(string(text))
	if err != nil {
		fmt.Fprintln(os.Stderr, "template:", err)
		os.Exit(1)
	}
	if err := t.Execute(os.Stdout, data); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
