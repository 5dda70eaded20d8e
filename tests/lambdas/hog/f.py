def f(event):
    chunks = []
    for _ in range(event["mb"]):
        chunks.append(bytearray(1 << 20))  # touched: bytearray zero-fills
    return {"allocated_mb": len(chunks)}
