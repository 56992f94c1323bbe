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
// or empty. A value that does not parse returns an *Error naming the variable (the
// first one, when several do not parse; ParseAll names them all).
func Parse(v any, prefix string, environ map[string]string) error {
	errs := ParseAll(v, prefix, environ)
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// ParseAll is Parse that reports every variable that does not parse, each as an *Error,
// in field order; a field whose variable does not parse keeps the value it had (its
// envDefault is not applied). It returns nil when all parse.
func ParseAll(v any, prefix string, environ map[string]string) Errors {
	err := env.ParseWithOptions(v, env.Options{Environment: environ, Prefix: prefix})
	if err == nil {
		return nil
	}
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return Errors{err}
	}
	var errs Errors
	for _, e := range agg.Errors {
		errs.Add(named(v, prefix, environ, e))
	}
	return errs
}

// named turns env's error about a field of *v into an *Error naming its variable;
// other errors are returned as they are.
func named(v any, prefix string, environ map[string]string, err error) error {
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

// Errors is a list of bad settings, at most one error a variable, in the order they
// were added. Its message is theirs, one a line (as errors.Join's; a message of one
// error is one line). errors.As finds each *Error in it. The zero value is an empty
// list; Add is not safe for concurrent use.
type Errors []error

func (e Errors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap returns the errors of the list, for errors.Is and errors.As.
func (e Errors) Unwrap() []error { return e }

// Add appends err to the list: each error of err when it is an Errors, nothing when it
// is nil, and nothing when it names (through an *Error) a variable that an error of
// the list already names: a value that did not parse is reported once, not again as
// out of range.
func (e *Errors) Add(err error) {
	switch err := err.(type) {
	case nil:
		return
	case Errors:
		for _, one := range err {
			e.Add(one)
		}
		return
	}
	var named *Error
	if errors.As(err, &named) && e.Names(named.Var) {
		return
	}
	*e = append(*e, err)
}

// Names reports whether an error of the list names the variable name through an
// *Error.
func (e Errors) Names(name string) bool {
	for _, err := range e {
		var named *Error
		if errors.As(err, &named) && named.Var == name {
			return true
		}
	}
	return false
}

// Err returns the list as an error, or nil when it is empty.
func (e Errors) Err() error {
	if len(e) == 0 {
		return nil
	}
	return e
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
