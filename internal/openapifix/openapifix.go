// Package openapifix mends, in a loaded copy, the defects of OPSWAT's OpenAPI
// description of Core that the tests of the emulator (its contract with Core's API)
// and of the bridge (the schema of a result) both meet, so that they check against the
// same corrected contract.
package openapifix

import (
	"slices"

	"github.com/getkin/kin-openapi/openapi3"
)

// AddNoThreatDetected mends a defect of OPSWAT's OpenAPI description of Core (the one
// vendored in coresim/testdata/openapi): its string enumeration of scan results lists
// "Threat Detected" where Core answers "No Threat Detected" for scan_all_result_i 0 (the
// same file's own table says so; docs/core-api.md, Results). It adds "No Threat
// Detected" to every schema reachable from doc's operations (parameters, request and
// response bodies, callbacks) whose enumeration holds "Threat Detected" but not it, and
// returns their number: 0 means the spec changed and the patch must be revisited. It
// changes doc in place; call it before the schemas are used, from one goroutine.
func AddNoThreatDetected(doc *openapi3.T) int {
	seen := map[*openapi3.Schema]bool{}
	n := 0
	var walk func(*openapi3.SchemaRef)
	walk = func(ref *openapi3.SchemaRef) {
		if ref == nil || ref.Value == nil || seen[ref.Value] {
			return
		}
		s := ref.Value
		seen[s] = true
		if slices.Contains(s.Enum, any("Threat Detected")) && !slices.Contains(s.Enum, any("No Threat Detected")) {
			s.Enum = append(s.Enum, "No Threat Detected")
			n++
		}
		for _, p := range s.Properties {
			walk(p)
		}
		for _, list := range []openapi3.SchemaRefs{s.AllOf, s.AnyOf, s.OneOf} {
			for _, r := range list {
				walk(r)
			}
		}
		walk(s.Items)
		walk(s.Not)
		walk(s.AdditionalProperties.Schema)
	}
	var walkOp func(*openapi3.Operation)
	walkOp = func(op *openapi3.Operation) {
		for _, p := range op.Parameters {
			if p.Value != nil {
				walk(p.Value.Schema)
			}
		}
		if op.RequestBody != nil && op.RequestBody.Value != nil {
			for _, mt := range op.RequestBody.Value.Content {
				walk(mt.Schema)
			}
		}
		if op.Responses != nil {
			for _, r := range op.Responses.Map() {
				if r.Value != nil {
					for _, mt := range r.Value.Content {
						walk(mt.Schema)
					}
				}
			}
		}
		for _, cb := range op.Callbacks {
			if cb.Value == nil {
				continue
			}
			for _, pi := range cb.Value.Map() {
				for _, o := range pi.Operations() {
					walkOp(o)
				}
			}
		}
	}
	for _, pi := range doc.Paths.Map() {
		for _, op := range pi.Operations() {
			walkOp(op)
		}
	}
	return n
}
