// Command terroir is Terroir's one binary: a node (start), the embedded demo
// cluster (demo), the operator's tools (cert, status, admin, kv, backup,
// changefeed) and the benchmarks (bench).
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/terroir-db/terroir/internal/admin"
	"github.com/terroir-db/terroir/internal/version"
)

func main() {
	tuneGC()
	startProcs()
	code := runCLI(os.Args[1:], os.Stdout, os.Stderr)
	stopProcs()
	os.Exit(code)
}

// runCLI runs the command line args and prints a failure as its user reads
// it: gRPC's envelopes removed (the full text with --verbose). It returns
// the process's exit code.
func runCLI(args []string, stdout, stderr io.Writer) int {
	cmd := rootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	err := cmd.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "error:", userMessage(err, cmd))
	return 1
}

// userMessage is err's text for a CLI user: cleaned of RPC internals unless
// --verbose was given.
func userMessage(err error, cmd *cobra.Command) string {
	if v, _ := cmd.PersistentFlags().GetBool("verbose"); v {
		return err.Error()
	}
	return admin.CleanRPCText(err.Error())
}

func rootCmd() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "terroir",
		Short:         "Terroir: a geo-distributed, strictly serializable transactional key-value store (Chablis)",
		Version:       version.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
			return nil
		},
	}
	root.SetVersionTemplate("terroir {{.Version}}\n")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	root.PersistentFlags().Bool("verbose", false, "print errors in full, with the RPC layer's text")
	root.AddCommand(startCmd(), demoCmd(), benchCmd(), kvCmd(), adminCmd(), backupCmd(), restoreCmd(), changefeedCmd(),
		nemesisCmd(), certCmd(), statusCmd(), versionCmd())
	return root
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cobra.NoArgs,
		Run: func(c *cobra.Command, _ []string) {
			fmt.Fprintf(c.OutOrStdout(), "terroir %s\n", version.String())
		},
	}
}
