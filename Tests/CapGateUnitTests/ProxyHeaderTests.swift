import HTTPTypes
import NIOHTTP1
import Testing

@testable import CapGate

/// Which header fields cross the gateway (SPEC §2, Proxy/ForwardedFields.swift): the client's
/// credentials and hop-by-hop fields never reach the provider, and the provider's account-wide
/// fields never reach a tenant.
@Suite("Proxy headers: what is forwarded and what comes back")
struct ProxyHeaderTests {
    /// The names of `names` that go upstream, with `connection` as the request's Connection values.
    static func forwarded(_ names: [String], connection: [String] = []) -> [String] {
        let options = ForwardedFields.connectionOptions(connection)
        return names.filter { ForwardedFields.forwardsRequestHeader($0, connectionOptions: options) }
    }

    static func returned(_ names: [String], connection: [String] = []) -> [String] {
        let options = ForwardedFields.connectionOptions(connection)
        return names.filter { ForwardedFields.forwardsResponseHeader($0, connectionOptions: options) }
    }

    @Test("request: hop-by-hop fields (RFC 9110 §7.6.1) and the framing fields never go upstream")
    func hopByHop() {
        let names = [
            "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-connection", "proxy-authenticate",
            "host", "content-length", "expect",
        ]
        #expect(Self.forwarded(names).isEmpty)
    }

    @Test("request: the client's key, token and cookies, company headers, method overrides and forwarding notes never go upstream")
    func credentialsAndSteering() {
        let names = [
            "x-api-key", "authorization", "proxy-authorization", "cookie", "x-capgate-company", "x-company-id", "capgate-feature",
            "x-http-method-override", "x-http-method", "x-method-override", "x-forwarded-for", "x-forwarded-host",
            "x-forwarded-proto", "x-forwarded-port", "forwarded", "x-real-ip", "via", "accept-encoding",
        ]
        #expect(Self.forwarded(names).isEmpty)
    }

    @Test("request: what the provider reads goes on: content type, API version and beta flags, accept, user agent, SDK fields")
    func providerFields() {
        let names = ["content-type", "anthropic-version", "anthropic-beta", "accept", "user-agent", "x-stainless-lang", "x-custom"]
        #expect(Self.forwarded(names) == names)
    }

    @Test("Connection names more hop-by-hop fields: a list in any case, spaces and tabs around, several Connection fields")
    func connectionNamed() {
        #expect(
            ForwardedFields.connectionOptions(["close, X-Trace ,\tx-Debug", "keep-alive"]) == ["close", "x-trace", "x-debug", "keep-alive"])
        #expect(ForwardedFields.connectionOptions([]).isEmpty && ForwardedFields.connectionOptions([" , ,"]).isEmpty)
        #expect(Self.forwarded(["x-trace", "x-debug", "x-other"], connection: ["X-Trace, x-debug"]) == ["x-other"])
        #expect(Self.returned(["x-trace", "content-type"], connection: ["x-trace"]) == ["content-type"])
        // Naming a field the provider needs does not make CapGate keep what it always drops.
        #expect(Self.forwarded(["x-api-key"], connection: ["close"]).isEmpty)
    }

    @Test("answer: the provider's account-wide fields never reach a tenant: its rate limits, organisation and cookies")
    func accountWide() {
        let dropped = [
            "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-input-tokens-reset",
            "x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens", "anthropic-organization-id", "anthropic-organization-name",
            "set-cookie",
        ]
        #expect(Self.returned(dropped).isEmpty)
        #expect(dropped.allSatisfy(ForwardedFields.isAccountWideResponseField))
        #expect(!ForwardedFields.isAccountWideResponseField("anthropic-ratelimit"))
        #expect(!ForwardedFields.isAccountWideResponseField("retry-after"))
    }

    @Test("answer: hop-by-hop fields and the provider's own request-id and RateLimit fields are replaced, the rest comes back")
    func answerFields() {
        let dropped = [
            "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "trailer", "proxy-authenticate", "proxy-connection",
            "content-length", "request-id", "ratelimit", "ratelimit-policy",
        ]
        #expect(Self.returned(dropped).isEmpty)
        let kept = ["content-type", "retry-after", "cache-control", "anthropic-version", "x-should-retry", "content-encoding"]
        #expect(Self.returned(kept) == kept)
    }

    @Test("the answer's head: names in any case, order and repeats kept, what Connection names dropped")
    func returnedHeaders() {
        let upstream = NIOHTTP1.HTTPHeaders([
            ("Content-Type", "text/event-stream"), ("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"),
            ("Set-Cookie", "session=abc"), ("Anthropic-RateLimit-Tokens-Remaining", "999"), ("Request-Id", "req_upstream"),
            ("Cache-Control", "no-cache"), ("Vary", "a"), ("Vary", "b"), ("Content-Length", "12"),
        ])
        let fields = Responder.returnedHeaders(upstream).map { "\($0.name.canonicalName): \($0.value)" }
        #expect(fields == ["content-type: text/event-stream", "cache-control: no-cache", "vary: a", "vary: b"])
    }

    @Test("the path routes are matched on is the target without its query or fragment; ledger text is clipped and loses NUL")
    func callTexts() {
        #expect(Call.rawPath("/v1/messages?beta=true") == "/v1/messages")
        #expect(Call.rawPath("/v1/models#top") == "/v1/models")
        #expect(Call.rawPath("/v1/x?a=1#b") == "/v1/x" && Call.rawPath("") == "" && Call.rawPath(nil) == nil)
        #expect(Call.ledgerText("abc\u{0}defg", limit: 5) == "abcd")
        #expect(Call.ledgerText("claude-x", limit: 64) == "claude-x")
        #expect(Call.ledgerText("ééé", limit: 2) == "éé")
    }
}
