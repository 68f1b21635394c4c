-- mixer_dims.lua - an MLP-Mixer block whose sizes may coincide, for
-- tests/cli/dim_names.sh: every dim must print by where it came from (a
-- sym name written in the script, carried through the ops), never by its
-- number.
--
-- Config: batch 4 (B), P 16 patches, D 16 channels, K 10 classes (sym
-- names); tok 16, the token-mixing hidden size, is given as a plain number
-- (by default equal to P and D); the channel MLP's hidden size 2*D is a
-- number too.
-- Inputs:  x f32[B,P,D], y i32[B].   Output: loss.
local cfg = config{batch = 4, P = 16, D = 16, tok = 16, K = 10}
sym{B = cfg.batch, P = cfg.P, D = cfg.D, K = cfg.K}

local x = input("x", {"B", "P", "D"})
local y = input("y", {"B"}, "i32")
local tok1 = param("tok1.weight", {"P", cfg.tok}, normal(0.02))
local tok2 = param("tok2.weight", {cfg.tok, "P"}, normal(0.02))
local ln1, ln2 = nn.LayerNorm("ln1", "D"), nn.LayerNorm("ln2", "D")
local ch = nn.MLP("ch", "D", 2 * size("D"))
local head = nn.Linear("head", "D", "K")

-- token mixing: across patches, on [B, D, P]
local t = matmul(nn.gelu(matmul(ln1(x):transpose(1, 2), tok1)), tok2)
x = x + t:transpose(1, 2)
-- channel mixing: across channels, on [B, P, D]
x = x + ch(ln2(x))
-- sum over patches (a mean would add a 1/P const equal to LayerNorm's 1/D)
minimize(nn.cross_entropy(head(x:sum(1)), y))
train{data = "blobs", batch = cfg.batch, steps = 1}
