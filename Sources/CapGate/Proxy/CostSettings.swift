/// How a call's cost is bounded and learnt (SPEC §11), from `costs.*`.
public struct CostSettings: Sendable {
    /// `costs.promptOverheadTokens` / `COSTS_PROMPT_OVERHEAD_TOKENS` (default `1000`): what the
    /// provider adds to a prompt for tools and system text, on top of the body's bytes.
    public var promptOverheadTokens: Int
    /// `costs.imageTokens` / `COSTS_IMAGE_TOKENS` (default `5000`): held for each image block, above
    /// the most the provider charges for one image.
    public var imageTokens: Int
    /// `costs.drainSeconds` / `COSTS_DRAIN_SECONDS` (default `60`): how long CapGate keeps reading
    /// the provider's stream after the client left, to learn the call's usage; past it the call is
    /// charged its hold.
    public var drainSeconds: Int

    public init(promptOverheadTokens: Int = 1_000, imageTokens: Int = 5_000, drainSeconds: Int = 60) {
        self.promptOverheadTokens = promptOverheadTokens
        self.imageTokens = imageTokens
        self.drainSeconds = drainSeconds
    }
}
