-- a shape mistake inside the nn library is reported at the script's line
local x = input("x", {4, 8})
local fc = nn.Linear("fc", 16, 4)
local y = fc(x) -- ERROR
minimize(y:sum())
