import ArgumentParser
import NIOCore
import NIOPosix

// Swift Concurrency runs on the NIO event loops, so a request's handler, its PostgreSQL query
// and its upstream call continue on the loop that did the I/O instead of hopping to another
// thread pool at every await (measured in BENCHMARKS.md). Must run first, on the main thread.
_ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()

/// Runs an async subcommand through its `async` entry point.
func runAsync<Command: AsyncParsableCommand>(_ command: Command) async throws {
    var command = command
    try await command.run()
}

func dispatch() async -> Never {
    do {
        let command = try CapGateCommand.parseAsRoot()
        switch command {
        case let c as Serve: try await runAsync(c)
        case let c as CheckConfig: try await runAsync(c)
        case let c as Dev: try await runAsync(c)
        case let c as Migrate: try await runAsync(c)
        case let c as Rollover: try await runAsync(c)
        case let c as Verify: try await runAsync(c)
        case let c as Unsettled.List: try await runAsync(c)
        case let c as Unsettled.Keep: try await runAsync(c)
        case let c as Unsettled.Refund: try await runAsync(c)
        case let c as Ledger.Export: try await runAsync(c)
        case let c as Ledger.Drop: try await runAsync(c)
        case let c as Database: try await runAsync(c)
        case let c as Mock: try await runAsync(c)
        default:
            var c = command
            try c.run()
        }
        CapGateCommand.exit()
    } catch {
        CapGateCommand.exit(withError: error)
    }
}

await dispatch()
