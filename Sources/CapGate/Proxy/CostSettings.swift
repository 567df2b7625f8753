import Configuration

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

    /// `costs.toolOverheadTokens` / `COSTS_TOOL_OVERHEAD_TOKENS` (a JSON object, merged over
    /// ``publishedToolOverhead``): the tokens the provider adds for a tool it defines, by the
    /// tool's `type`, and under `tool_choice` the tool-use system prompt it adds once to any call
    /// with tools. A provider-defined tool type not listed cannot be held (SPEC §11: 400 where a
    /// budget or token window applies).
    public var toolOverheadTokens: [String: Int]

    /// The provider's published figures (Anthropic's tool-use documentation, for the Claude 4
    /// models): the tool-use system prompt is 346 tokens (`auto`/`none`; 313 for `any`/`tool`),
    /// the bash tool adds 245, the text editor tool 700, the computer-use tool 735 for its
    /// definition plus a 466–499-token system prompt (499 taken). Server tools (web search and
    /// fetch, code execution) are not listed: what they add is billed by use and cannot be held.
    public static let publishedToolOverhead: [String: Int] = [
        "tool_choice": 346,
        "bash_20241022": 245, "bash_20250124": 245,
        "text_editor_20241022": 700, "text_editor_20250124": 700, "text_editor_20250429": 700, "text_editor_20250728": 700,
        "computer_20241022": 1_234, "computer_20250124": 1_234, "computer_20251124": 1_234,
    ]

    public init(
        promptOverheadTokens: Int = 1_000, imageTokens: Int = 5_000, drainSeconds: Int = 60,
        toolOverheadTokens: [String: Int] = publishedToolOverhead
    ) {
        self.promptOverheadTokens = promptOverheadTokens
        self.imageTokens = imageTokens
        self.drainSeconds = drainSeconds
        self.toolOverheadTokens = toolOverheadTokens
    }

    /// `costs.toolOverheadTokens`'s text: a JSON object of whole numbers from 0 to 1,000,000,
    /// merged over ``publishedToolOverhead``; nil when it is not one.
    public static func toolOverhead(parsing text: String) -> [String: Int]? {
        guard case .object(let fields)? = try? JSON.parse(Array(text.utf8)) else { return nil }
        var out = publishedToolOverhead
        for field in fields {
            guard !field.key.isEmpty, field.key.utf8.count <= 100, let value = field.value.intValue, (0...1_000_000).contains(value)
            else { return nil }
            out[field.key] = Int(value)
        }
        return out
    }
}

extension CostSettings {
    static let keys = ["costs.promptOverheadTokens", "costs.imageTokens", "costs.drainSeconds", "costs.toolOverheadTokens"]

    /// Reads and validates the `costs.*` keys.
    init(reader: ConfigReader) throws {
        self.init(
            promptOverheadTokens: try CapGateConfiguration.int(reader, "costs.promptOverheadTokens", default: 1_000, range: 0...1_000_000),
            imageTokens: try CapGateConfiguration.int(reader, "costs.imageTokens", default: 5_000, range: 0...1_000_000),
            drainSeconds: try CapGateConfiguration.int(reader, "costs.drainSeconds", default: 60, range: 0...3600),
            toolOverheadTokens: try CapGateConfiguration.nonEmpty(reader.string(forKey: "costs.toolOverheadTokens")).map { text in
                guard let map = Self.toolOverhead(parsing: text) else {
                    throw ConfigurationError(
                        key: "costs.toolOverheadTokens",
                        problem: #"must be a JSON object of tool types (or "tool_choice") to whole numbers of tokens from 0 to 1000000"#)
                }
                return map
            } ?? Self.publishedToolOverhead)
    }
}
