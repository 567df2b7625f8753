@testable import CapGate

/// A deterministic generator (SplitMix64, its finaliser is the request ids' mix), so a failed
/// random test can be replayed from the seed it prints.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        return GatewayEdge.mix(state)
    }
}
