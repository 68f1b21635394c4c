-- options tables checked (frontend.c, fe_check_opts): odd keys and values,
-- each call in a pcall so one script reaches every check
local x = input("x", {4, 8})
local long = string.rep("k", 5000)
local tries = {
  function() return nn.Linear("a", 8, 4, {bais = false}) end,
  function() return nn.Linear("b", 8, 4, {[long] = 1}) end,
  function() return nn.Linear("c", 8, 4, {[1.5] = 1, [x] = 2}) end,
  function() return nn.Linear("d", 8, 4, setmetatable({}, {__index = {bias = false}})) end,
  function() return nn.Linear("e", 8, 4, x) end,
  function() return nn.MLP("f", 8, 16, {act = setmetatable({}, {__call = nn.gelu})}) end,
  function() return nn.attention(x, x, x, {window = 4, mask = x, causal = "yes"}) end,
  function() return matmul(x, x, {tb = true, [true] = 1}) end,
  function() return output("o", x, {train = {}}) end,
  function() return x:sum({axis = 1, [0] = 1}) end,
  function() return input("y", {B = 4, [-1] = 2}) end,
}
for _, f in ipairs(tries) do pcall(f) end
local fc = nn.Linear("fc", 8, 4, {bias = false, std = 0.1})
minimize(fc(x):sum())
