import Foundation
import Hummingbird

/// A metered call, in four steps (SPEC §2):
///
/// 1. ``CallReader``: the credential (company and user only from a verified one, before a byte of
///    the body is read), the head, the body within its budgets, its one strict reading;
/// 2. ``Admitter``: its route's units and feature, and its admission in one PostgreSQL
///    transaction: charged, refused (nothing charged), or replayed under an `Idempotency-Key`;
/// 3. ``Forwarder``: the provider, with its key, within the company's share of the connections;
///    given back if the provider never answered;
/// 4. ``Responder``: every refusal's answer, and the provider's answer passed back: 2xx settled
///    with its token counts, anything else given back first.
public struct ProxyHandler: Sendable {
    let reader: CallReader
    let admitter: Admitter
    let forwarder: Forwarder
    let responder: Responder

    public init(
        authenticator: Authenticator, metering: MeteringStore, upstream: UpstreamClient, knownKeys: KnownKeys, routes: RouteTable,
        maxBodyBytes: Int, bodyBudget: BodyBudget, idempotencyMaxBytes: Int, maxJSONDepth: Int = 128, companySharePercent: Int = 25,
        costs: CostSettings = CostSettings()
    ) {
        reader = CallReader(
            authenticator: authenticator, knownKeys: knownKeys, maxBodyBytes: maxBodyBytes, bodyBudget: bodyBudget,
            bodyShare: CompanyShare(total: bodyBudget.limit, percent: companySharePercent), maxJSONDepth: maxJSONDepth)
        admitter = Admitter(
            metering: metering, routes: routes, idempotencyMaxBytes: idempotencyMaxBytes, costs: costs,
            usage: UsageStore(database: metering.database))
        forwarder = Forwarder(
            upstream: upstream, share: CompanyShare(total: upstream.limiter.maxConnections, percent: companySharePercent))
        responder = Responder(
            metering: metering, idempotencyMaxBytes: idempotencyMaxBytes, drain: .seconds(costs.drainSeconds))
    }

    /// A 401 for a request without a valid credential (any identity passes: a user's key or token,
    /// an admin's, the operator's); nothing else is read. Run before a refusal that SPEC §2 orders
    /// after 401 but that is found before the caller is (a path CapGate will not forward).
    public func requireCredential(_ request: Request) async throws {
        if let apiKey = reader.authenticator.apiKey(in: request.headers) {
            _ = try await reader.knownKeys.check(apiKey)
        } else {
            _ = try await reader.authenticator.authenticate(request.headers)
        }
    }

    public func handle(_ request: Request, context: GatewayContext) async throws -> Response {
        let call = try await reader.read(request, requestID: context.record.snapshot.requestID)
        let admitted: AdmittedCall
        switch try await admitter.admit(call, record: context.record) {
        case .admitted(let charged): admitted = charged
        case .refused(let refusal, let state): throw Responder.error(for: refusal, state: state)
        case .replayed(let answer): return IdempotencyKey.replay(answer)
        }
        let answer = try await forwarder.forward(call, admitted, logger: context.logger, record: context.record)
        return await responder.respond(answer, to: call, admitted, logger: context.logger, record: context.record)
    }
}
