// Command chart-sync copies the CRDs, the manager ClusterRole, the record-protection
// policy and the alerting rules from config/ into the Helm chart
// (internal/chartsync). Run from the repository root; `make manifests` does.
package main

import (
	"fmt"
	"os"

	"github.com/settlement-operator/settlement-operator/internal/chartsync"
)

func main() {
	if err := chartsync.Write("."); err != nil {
		fmt.Fprintln(os.Stderr, "chart-sync:", err)
		os.Exit(1)
	}
}
