package labstack

import "testing"

func TestParseFunctionError(t *testing.T) {
	for _, c := range []struct {
		body     string
		wantType string // "" for no function error
	}{
		{`{"greeting":"hi"}`, ""},
		{`{"errorMessage":"looks like an error field"}`, ""},
		{`"errorType"`, ""},
		{`null`, ""},
		{`[]`, ""},
		{``, ""},
		{`{"errorMessage":"boom","errorType":"errorString"}`, "errorString"},
		{`{"errorMessage":"x","errorType":"string","stackTrace":[{"path":"main.go"}]}`, "string"},
		{`Task timed out after 3.00 seconds`, "Sandbox.Timedout"},
	} {
		fe := parseFunctionError([]byte(c.body))
		got := ""
		if fe != nil {
			got = fe.Type
		}
		if got != c.wantType {
			t.Errorf("parseFunctionError(%q) type = %q, want %q", c.body, got, c.wantType)
		}
	}
}
