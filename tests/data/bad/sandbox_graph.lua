-- a loop that builds ops without end stops at the graph bound (KILN_MAX_OPS)
local x = input("x", {4, 8})
local y = x
while true do
  y = y * 2 + x -- ERROR
end
minimize(y:sum())
