// Command terroir is Terroir's one binary: a node (start), the embedded demo
// cluster (demo) and the benchmarks (bench).
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "terroir",
		Short:         "Terroir: a geo-distributed, strictly serializable transactional key-value store (Chablis)",
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
	root.PersistentFlags().StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	root.AddCommand(startCmd(), demoCmd(), benchCmd(), kvCmd(), adminCmd(), backupCmd(), restoreCmd(), changefeedCmd(), nemesisCmd())
	return root
}
