package fakeopenmeter

import (
	"net/http"
	"time"

	"github.com/settlement-operator/settlement-operator/test/adaptercontract"
)

// The OpenMeter adapter finds an event by listing, so the adapter contract
// (test/adaptercontract) fails its reads and passes its deduplication window.
var (
	_ adaptercontract.LookupFaultFixture = (*Server)(nil)
	_ adaptercontract.WindowFixture      = (*Server)(nil)
)

// FailLookups makes the next n listings answer OpenMeter's 500 problem.
func (s *Server) FailLookups(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readFaults += n
}

// PassWindow forgets every event's source and id for deduplication, as once the
// window has passed; the events stay counted and listed.
func (s *Server) PassWindow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = map[string]time.Time{}
}

// failRead answers a listing 500 while FailLookups says so.
func (s *Server) failRead(w http.ResponseWriter, req *http.Request) bool {
	s.mu.Lock()
	fail := s.readFaults > 0
	if fail {
		s.readFaults--
	}
	s.mu.Unlock()
	if fail {
		s.record(Request{Method: req.Method, Path: req.URL.Path, Status: http.StatusInternalServerError})
		problem(w, http.StatusInternalServerError, "internal server error")
	}
	return fail
}
