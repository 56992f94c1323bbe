// Package envconf parses environment variables into a struct with
// github.com/caarlos0/env, and turns its errors, which name Go fields, into errors that
// name the variable and say what it accepts.
package envconf

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Error is a bad setting: Var is the environment variable, Value what it held, Want
// what it accepts.
type Error struct {
	Var, Value, Want string
}

func (e *Error) Error() string { return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Want) }

// Accepts returns what a variable parsed into a field of type t accepts, in words.
func Accepts(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return "want a duration with its unit (e.g. 500ms, 2s, 1m)"
	case reflect.TypeFor[float64]():
		return "want a number, fractions allowed (e.g. 0.5)"
	case reflect.TypeFor[bool]():
		return "want true or false"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64, reflect.Uint:
		return "want a whole number"
	case reflect.Slice:
		return "want a comma-separated list"
	}
	return "want a " + t.String()
}

// Parse fills the struct pointed to by v from environ (variable name to value), each
// field from the variable prefix + its env tag, with env's defaults (envDefault) for
// unset variables; a field without a default keeps its value when its variable is unset
// or empty. A value that does not parse returns an *Error naming the variable.
func Parse(v any, prefix string, environ map[string]string) error {
	err := env.ParseWithOptions(v, env.Options{Environment: environ, Prefix: prefix})
	if err == nil {
		return nil
	}
	var pe env.ParseError
	if !errors.As(err, &pe) {
		return err
	}
	f, ok := reflect.TypeOf(v).Elem().FieldByName(pe.Name)
	if !ok {
		return err
	}
	key, _, _ := strings.Cut(f.Tag.Get("env"), ",") // drop options such as ",notEmpty"
	name := prefix + key
	return &Error{Var: name, Value: environ[name], Want: Accepts(f.Type)}
}

// Invalid returns the *Error of the variable prefix+name, holding its value in environ,
// for a value that parses but is out of range; want says what it accepts.
func Invalid(environ map[string]string, prefix, name, want string) *Error {
	return &Error{Var: prefix + name, Value: environ[prefix+name], Want: want}
}

// EmptyWhenSet empties each field whose variable (prefix + key) is set to "" in
// environ. env gives such a variable its envDefault; for an address, an empty value (a
// ${VAR} that expanded to nothing) means something else or is a mistake that
// validation must see.
func EmptyWhenSet(environ map[string]string, prefix string, fields map[string]*string) {
	for name, p := range fields {
		if v, set := environ[prefix+name]; set && v == "" {
			*p = ""
		}
	}
}

// Names returns the variables that Parse reads for the struct type T: prefix + each
// field's env tag, in field order.
func Names[T any](prefix string) []string {
	var names []string
	for _, f := range reflect.VisibleFields(reflect.TypeFor[T]()) {
		if key, _, _ := strings.Cut(f.Tag.Get("env"), ","); key != "" && key != "-" {
			names = append(names, prefix+key)
		}
	}
	return names
}

// Unknown returns, sorted, the variables of environ that start with prefix but are not
// in known: settings that would be ignored, most likely misspelt.
func Unknown(prefix string, environ map[string]string, known []string) []string {
	var unknown []string
	for k := range environ {
		if strings.HasPrefix(k, prefix) && !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	return unknown
}
