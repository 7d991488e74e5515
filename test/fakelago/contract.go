package fakelago

import (
	"net/http"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// The adapter contract's optional interfaces (test/adaptercontract): Lago's adapter
// looks up by key, so the fixture can fail reads and pass its window.
var (
	_ adaptercontract.LookupFaultFixture = (*Server)(nil)
	_ adaptercontract.WindowFixture      = (*Server)(nil)
)

// FailLookups makes the next n reads (a GET by transaction_id, a listing page) answer
// Lago's 500 {"status":500,"error":"Internal Server Error"}.
func (s *Server) FailLookups(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookupFaults += n
}

// PassWindow changes nothing: Lago's default pipeline keeps a transaction_id unique
// for its subscription as long as the event exists, and the ClickHouse pipeline never
// refuses one, so no window passes.
func (s *Server) PassWindow() {}

// failRead answers a read 500 while FailLookups says so.
func (s *Server) failRead(w http.ResponseWriter, r *http.Request) bool {
	s.mu.Lock()
	fail := s.lookupFaults > 0
	if fail {
		s.lookupFaults--
	}
	s.mu.Unlock()
	if fail {
		s.note(Request{Method: r.Method, Path: r.URL.Path, Status: http.StatusInternalServerError})
		writeError(w, http.StatusInternalServerError, "", nil)
	}
	return fail
}
