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

// LambdaVCPU follows Lambda's one vCPU per 1,769 MB.
func TestLambdaVCPU(t *testing.T) {
	for mb, want := range map[int]float64{1769: 1, 3538: 2, 256: 256.0 / 1769} {
		if got := LambdaVCPU(mb); got != want {
			t.Errorf("LambdaVCPU(%d) = %g, want %g", mb, got, want)
		}
	}
}
