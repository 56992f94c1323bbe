package envconf_test

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

type config struct {
	Addr    string        `env:"ADDR" envDefault:":8009"`
	Rate    float64       `env:"RATE"`
	Count   int           `env:"COUNT"`
	Big     int64         `env:"BIG"`
	N       uint          `env:"N"`
	Timeout time.Duration `env:"TIMEOUT" envDefault:"60s"`
	On      bool          `env:"ON"`
	List    []string      `env:"LIST" envSeparator:","`
	Level   int           `env:"LEVEL,notEmpty" envDefault:"1"`
}

// preset is the config before parsing: fields without envDefault keep these values
// when their variable is unset or empty.
func preset() config { return config{Rate: 2, Count: 3, On: true} }

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    config
	}{
		{
			name:    "unset keeps preset values, defaults applied",
			environ: map[string]string{},
			want:    config{Addr: ":8009", Rate: 2, Count: 3, Timeout: time.Minute, On: true, Level: 1},
		},
		{
			name: "empty keeps preset values and defaults",
			environ: map[string]string{
				"APP_ADDR": "", "APP_RATE": "", "APP_COUNT": "", "APP_TIMEOUT": "", "APP_ON": "",
			},
			want: config{Addr: ":8009", Rate: 2, Count: 3, Timeout: time.Minute, On: true, Level: 1},
		},
		{
			name: "every field set",
			environ: map[string]string{
				"APP_ADDR":    ":9000",
				"APP_RATE":    "0.5",
				"APP_COUNT":   "-4",
				"APP_BIG":     "9000000000",
				"APP_N":       "7",
				"APP_TIMEOUT": "1.5s",
				"APP_ON":      "false",
				"APP_LIST":    "10.0.0.0/8,192.168.0.0/16",
				"APP_LEVEL":   "3",
			},
			want: config{
				Addr: ":9000", Rate: 0.5, Count: -4, Big: 9_000_000_000, N: 7,
				Timeout: 1500 * time.Millisecond, On: false,
				List: []string{"10.0.0.0/8", "192.168.0.0/16"}, Level: 3,
			},
		},
		{
			name:    "variables without the prefix are ignored",
			environ: map[string]string{"RATE": "9", "ADDR": ":1", "APPRATE": "9", "OTHER_RATE": "x"},
			want:    config{Addr: ":8009", Rate: 2, Count: 3, Timeout: time.Minute, On: true, Level: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := preset()
			if err := envconf.Parse(&got, "APP_", tt.environ); err != nil {
				t.Fatalf("Parse(%v) = %v, want no error", tt.environ, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%v) = %+v, want %+v", tt.environ, got, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		variable, value, want string
	}{
		{"APP_RATE", "abc", "want a number, fractions allowed (e.g. 0.5)"},
		{"APP_RATE", "1,5", "want a number, fractions allowed (e.g. 0.5)"},
		{"APP_COUNT", "1.5", "want a whole number"},
		{"APP_COUNT", "ten", "want a whole number"},
		{"APP_BIG", "1e3", "want a whole number"},
		{"APP_N", "-1", "want a whole number"},
		{"APP_TIMEOUT", "2", "want a duration with its unit (e.g. 500ms, 2s, 1m)"},
		{"APP_TIMEOUT", "soon", "want a duration with its unit (e.g. 500ms, 2s, 1m)"},
		{"APP_ON", "yes", "want true or false"},
		{"APP_LEVEL", "high", "want a whole number"}, // a tag with an option
	}
	for _, tt := range tests {
		t.Run(tt.variable+"="+tt.value, func(t *testing.T) {
			c := preset()
			err := envconf.Parse(&c, "APP_", map[string]string{tt.variable: tt.value, "APP_ADDR": ":1"})
			var ee *envconf.Error
			if !errors.As(err, &ee) {
				t.Fatalf("Parse(%s=%q) = %T %v, want an *envconf.Error", tt.variable, tt.value, err, err)
			}
			want := &envconf.Error{Var: tt.variable, Value: tt.value, Want: tt.want}
			if *ee != *want {
				t.Errorf("Parse(%s=%q) = %+v, want %+v", tt.variable, tt.value, *ee, *want)
			}
		})
	}
}

// TestParseAll checks that every variable that does not parse is named, in field
// order, that the fields that parse are filled all the same, and that Parse names the
// first.
func TestParseAll(t *testing.T) {
	environ := map[string]string{
		"APP_ADDR": ":1", "APP_RATE": "abc", "APP_COUNT": "7", "APP_TIMEOUT": "2", "APP_ON": "yes",
	}
	c := preset()
	errs := envconf.ParseAll(&c, "APP_", environ)
	var names []string
	for _, err := range errs {
		var ee *envconf.Error
		if !errors.As(err, &ee) {
			t.Fatalf("ParseAll() error %v = %T, want an *envconf.Error", err, err)
		}
		names = append(names, ee.Var)
	}
	if want := []string{"APP_RATE", "APP_TIMEOUT", "APP_ON"}; !slices.Equal(names, want) {
		t.Errorf("ParseAll(%v) names %v, want %v", environ, names, want)
	}
	if c.Addr != ":1" || c.Count != 7 || c.Rate != 2 {
		t.Errorf("ParseAll(%v) = %+v, want Addr :1 and Count 7 parsed, Rate kept at 2", environ, c)
	}
	c = preset()
	var ee *envconf.Error
	if err := envconf.Parse(&c, "APP_", environ); !errors.As(err, &ee) || ee.Var != "APP_RATE" {
		t.Errorf("Parse(%v) = %v, want the *envconf.Error of APP_RATE alone", environ, err)
	}
	if c = preset(); envconf.ParseAll(&c, "APP_", map[string]string{"APP_RATE": "1"}) != nil {
		t.Errorf("ParseAll(APP_RATE=1) != nil, want nil")
	}
}

func TestErrors(t *testing.T) {
	var errs envconf.Errors
	if errs.Err() != nil {
		t.Errorf("empty Errors.Err() = %v, want nil", errs.Err())
	}
	a := &envconf.Error{Var: "APP_A", Value: "x", Want: "want a"}
	b := &envconf.Error{Var: "APP_B", Value: "y", Want: "want b"}
	other := errors.New("something else")
	errs.Add(nil)
	errs.Add(a)
	errs.Add(envconf.Errors{b, other})
	errs.Add(&envconf.Error{Var: "APP_A", Value: "x", Want: "want a, out of range"}) // named already
	errs.Add(fmt.Errorf("in a file: %w", &envconf.Error{Var: "APP_B", Value: "z"}))  // named already
	if len(errs) != 3 || errs[0] != error(a) || errs[1] != error(b) || errs[2] != other {
		t.Fatalf("Errors after Add = %q, want [a b other]", errs)
	}
	if got, want := errs.Error(), "APP_A=\"x\": want a\nAPP_B=\"y\": want b\nsomething else"; got != want {
		t.Errorf("Errors.Error() = %q, want %q (one a line)", got, want)
	}
	var ee *envconf.Error
	if err := errs.Err(); !errors.As(err, &ee) || ee != a || !errors.Is(err, other) {
		t.Errorf("errors.As(Errors.Err()) = %v, want the first *envconf.Error; errors.Is(other) true", ee)
	}
	if !errs.Names("APP_B") || errs.Names("APP_C") {
		t.Errorf("Errors.Names(APP_B), Names(APP_C) = %v, %v; want true, false", errs.Names("APP_B"), errs.Names("APP_C"))
	}
	if got := (envconf.Errors{a}).Error(); got != a.Error() {
		t.Errorf("Errors{a}.Error() = %q, want a's message %q", got, a.Error())
	}
}

// TestParseOtherErrors checks that errors that are not about a value pass through.
func TestParseOtherErrors(t *testing.T) {
	t.Run("not a pointer", func(t *testing.T) {
		err := envconf.Parse(config{}, "APP_", map[string]string{})
		var ee *envconf.Error
		if err == nil || errors.As(err, &ee) {
			t.Errorf("Parse(non-pointer) = %v, want a non-*envconf.Error error", err)
		}
	})
	t.Run("required variable unset", func(t *testing.T) {
		var c struct {
			URL string `env:"URL,required"`
		}
		err := envconf.Parse(&c, "APP_", map[string]string{})
		var notSet env.VarIsNotSetError
		if !errors.As(err, &notSet) || notSet.Key != "APP_URL" {
			t.Errorf("Parse(required APP_URL unset) = %v, want env.VarIsNotSetError for APP_URL", err)
		}
	})
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		e    envconf.Error
		want string
	}{
		{
			envconf.Error{Var: "MDPROXY_FILE_RESULT_RATE", Value: "abc", Want: "want a number, fractions allowed (e.g. 0.5)"},
			`MDPROXY_FILE_RESULT_RATE="abc": want a number, fractions allowed (e.g. 0.5)`,
		},
		{
			envconf.Error{Var: "X", Value: "", Want: "want a whole number"},
			`X="": want a whole number`,
		},
		{
			envconf.Error{Var: "X", Value: "a\"b", Want: "w"},
			`X="a\"b": w`,
		},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("(%+v).Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestAccepts(t *testing.T) {
	tests := []struct {
		t    reflect.Type
		want string
	}{
		{reflect.TypeFor[time.Duration](), "want a duration with its unit (e.g. 500ms, 2s, 1m)"},
		{reflect.TypeFor[float64](), "want a number, fractions allowed (e.g. 0.5)"},
		{reflect.TypeFor[bool](), "want true or false"},
		{reflect.TypeFor[int](), "want a whole number"},
		{reflect.TypeFor[int64](), "want a whole number"},
		{reflect.TypeFor[uint](), "want a whole number"},
		{reflect.TypeFor[[]string](), "want a comma-separated list"},
		{reflect.TypeFor[string](), "want a string"},
	}
	for _, tt := range tests {
		if got := envconf.Accepts(tt.t); got != tt.want {
			t.Errorf("Accepts(%v) = %q, want %q", tt.t, got, tt.want)
		}
	}
}

func TestInvalidAndEmptyWhenSet(t *testing.T) {
	env := map[string]string{"APP_ADDR": "", "APP_PORT": "99999"}
	if got := envconf.Invalid(env, "APP_", "PORT", "want a port"); got.Error() != `APP_PORT="99999": want a port` {
		t.Errorf("Invalid(...).Error() = %q, want the variable, its value and what it accepts", got.Error())
	}
	addr, other := ":80", ":81"
	envconf.EmptyWhenSet(env, "APP_", map[string]*string{"ADDR": &addr, "OTHER": &other})
	if addr != "" || other != ":81" {
		t.Errorf("EmptyWhenSet: addr %q, other %q; want the set-empty one emptied, the unset one kept", addr, other)
	}
}

func TestNamesUnknown(t *testing.T) {
	type conf struct {
		Addr  string `env:"ADDR"`
		Rate  int    `env:"RATE,notEmpty"`
		Inner string `env:"-"`
		Plain string
	}
	if got, want := envconf.Names[conf]("APP_"), []string{"APP_ADDR", "APP_RATE"}; !slices.Equal(got, want) {
		t.Errorf("Names = %v, want %v", got, want)
	}
	environ := map[string]string{"APP_ADDR": ":1", "APP_RAET": "5", "APP_PLAIN": "x", "OTHER_RAET": "5", "APP_A": ""}
	if got, want := envconf.Unknown("APP_", environ, envconf.Names[conf]("APP_")), []string{"APP_A", "APP_PLAIN", "APP_RAET"}; !slices.Equal(got, want) {
		t.Errorf("Unknown = %v, want %v", got, want)
	}
}
