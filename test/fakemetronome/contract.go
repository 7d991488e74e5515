package fakemetronome

import (
	"net/http"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// The Metronome adapter looks up by key (the events search), so the adapter contract
// (test/adaptercontract) fails its reads through the fixture.
var _ adaptercontract.LookupFaultFixture = (*Server)(nil)

// FailLookups makes the next n events searches answer Metronome's 500 {"message"}.
func (s *Server) FailLookups(n int) { s.FailSearch(http.StatusInternalServerError, n) }
