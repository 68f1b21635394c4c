-- tp_hand.lua - a small language model written by hand with param and
-- matmul (no nn layers but the norm and the loss), its params marked for
-- tensor parallelism with shard(): attention split by heads (q, k, v by
-- output columns, the output projection by input rows), an MLP split
-- column then row, an untied head split by vocabulary. tests/cli/tp.sh
-- trains it at tp = 1 and 2. --set conflict=true also splits wk by rows:
-- q k^T then contracts a split axis with a whole one, a conflict the
-- partition pass resolves by gathering (the losses still match).
local cfg = config({C = 16, H = 4, V = 256, T = 16, batch = 4, F = 32, conflict = false,
                    data = "text", data_path = "tests/data/tiny.txt"})
local B, T, C, V, H, F = cfg.batch, cfg.T, cfg.C, cfg.V, cfg.H, cfg.F
local D = C // H
local tokens = input("tokens", {B, T}, "i32")
local targets = input("targets", {B, T}, "i32")

local emb = shard(param("emb", {V, C}, normal(0.05)), 0)
local wq = shard(param("wq", {C, C}, normal(0.1)), 1)
local wk = shard(param("wk", {C, C}, normal(0.1)), cfg.conflict and 0 or 1)
local wv = shard(param("wv", {C, C}, normal(0.1)), 1)
local wo = shard(param("wo", {C, C}, normal(0.1)), 0)
local w1 = shard(param("w1", {C, F}, normal(0.1)), 1)
local b1 = shard(param("b1", {F}, zeros()), 0)
local w2 = shard(param("w2", {F, C}, normal(0.1)), 0)
local head = shard(param("head", {C, V}, normal(0.05)), 1)

local function heads(x) return x:reshape({B, T, H, D}):permute({0, 2, 1, 3}) end

local x = gather(emb, tokens)
local h = nn.LayerNorm("ln1", C)(x)
local q, k, v = heads(matmul(h, wq)), heads(matmul(h, wk)), heads(matmul(h, wv))
local s = matmul(q, k, {tb = true}) * (1 / math.sqrt(D))
local keep = iota({T, T}, 1, "i32"):le(iota({T, T}, 0, "i32"))
s = select(keep:broadcast_to({B, H, T, T}), s, const(-1e9):broadcast_to({B, H, T, T}))
local a = matmul(nn.softmax(s, -1), v):permute({0, 2, 1, 3}):reshape({B, T, C})
x = x + matmul(a, wo)
h = nn.LayerNorm("ln2", C)(x)
x = x + matmul(relu(matmul(h, w1) + b1), w2)
local logits = matmul(nn.LayerNorm("lnf", C)(x), head)
minimize(nn.cross_entropy(logits, targets))
train{data = cfg.data, data_path = cfg.data_path, batch = B, steps = 20, lr = 3e-3,
      grad_clip = 1.0, eval_every = 0}
