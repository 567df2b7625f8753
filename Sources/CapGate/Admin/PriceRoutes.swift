import Hummingbird

/// SPEC §11's price book, for the operator: read it whole, replace it whole. A replacement is
/// checked row by row first (``PriceBookReader``); a bad row is a 400 naming it, and nothing changes.
struct PriceRoutes {
    let prices: PriceStore

    func register(on group: RouterGroup<AuthenticatedContext>) {
        group.get("prices") { _, context in
            try context.requireOperator()
            return try jsonResponse(encoding: PriceBook(try await prices.book()))
        }
        group.put("prices") { request, context in
            try context.requireOperator()
            let fields = try await BodyFields.read(request, context: context, limit: PriceBookReader.maxBodyBytes)
            let book = try PriceBookReader.read(fields)
            return try jsonResponse(encoding: PriceBook(try await prices.replace(book, by: context.auditActor)))
        }
    }
}
