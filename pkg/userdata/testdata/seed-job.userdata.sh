#!/bin/bash
# Reaper user-data for Pod batch/provision-8fj2k (uid 7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d).
# Rendered by github.com/reaper-k8s/reaper/pkg/userdata; change the Pod, not this.
#
# Installs the workload supervisor (/usr/local/bin/reaper-wrapper, run by reaper-workload.service),
# points the CloudWatch agent at the exit log, and starts both. If a step
# fails, the host powers itself off in 10 min: no instance is left idling.
# REAPER_ROOT (unset on a real host) installs under another root, for tests.
set -Eeuo pipefail
root=${REAPER_ROOT:-}

fail() {
	echo "reaper user-data: failed at line $1; powering off in 10 min" >&2
	shutdown -P +10 "reaper: user-data failed" || true
	exit 1
}
trap 'fail $LINENO' ERR

umask 022
mkdir -p "$root/usr/local/bin" "$root/etc/reaper" "$root/etc/systemd/system" \
	"$root/opt/aws/amazon-cloudwatch-agent/etc" "$root/var/lib/reaper" "$root/var/log/reaper/"

# The wrapper, gzip-compressed to leave room for the Pod in EC2's 16 KiB;
# "reaper userdata -o wrapper" prints it.
base64 -d <<'REAPER_EOF' | gzip -dc >"$root/usr/local/bin/reaper-wrapper"
H4sIAAAAAAAC/7Q7a3PbOJLf+Ss6HDoSbdMi5cckUpg9b6JkfJPYOVvenR3Lq2JIUEZEkVqSspzY
ut9+1Q2AL0mZx+1WuWQSQDca3Y1+AfzhWeczjzvZnfYDpMybs9Rapt58ztJ9CNNkBhOe3y0+H/jJ
rCP7py8y+Qjz6aSzyFgaeLnXydlsHnk5yzoSw0F2B20/mc1YnGfgxQHwOGBx7uU8iSFls+SeBeaB
pmW5lzPXeLwcnH4aXI6vhqfDwfjt2WXP6tx7aSfin+WEK43Pgqwcefbx7dX4+vJDz7rL83mv03FO
Xh50j48O5P+VxnkwDnlUwX52fjU8PX8zGJ+9Hb87+zCoTOJHySLo0GJ4nOVe7DOLByst870qhuHZ
x8H46s0pwjorLV3EOZ+xMf4ki7wcd3l9TkPx5+J62LNObHulzRdRNPZy5FZeWcqn6w8fxqfD4eDj
p+FVzzpeadndIg+SZTz2Z0GFOT9dD99e/P18/Obj256lxoD1CeJkudK8CYvzccDTEuL0/eB8WGNq
Ms873jLreDPvWxJbtOyll/t3FoF3omSSdUgoSAWfj1kcuJqfxKFrPDo9q0D95uL83dn7ntVhuS9F
1Fkm6TRKvOAAx69W2jeWJq5t245Ff0Pb7tHfr1o4y93W4+PBFc5Ev4tstXoqWgYPPH+TBKzadnHx
8WceRSyoNl7lXpqz4DSvNr7jMc/uytazGsggTZN0tWppmlrKhzM3SPwpS6HJ6beDD6f/cE9sW/V8
PP1lfDm4Gp5eDq9ce238x4u3A3d5x2ILmTdngRrx6eLt+O+XZ8Ph4Hw8PH3vtlpq9sEvZ8Pxh4v3
rtDFZKK4yR54fhAlE4VCTjv+dPHh7M0/3Farivu/ry7OK02EdHjx8+C8MtObi/Ph6dn54LJC+fvL
0zcD97Bc39V7XKN7ZL88UW1/u/hw/XFwVZ3x9PpqMD77ePp+sNZ6eX0+Pr18j8M1LUombRMeYZ7y
OA+hVbczPdjJRnELdGNXh9fPu31YaRqPcwLxvYyB4QCPodWCJ9i9eWZbL293TUhZvkhjcKDfB5Z5
PoHF3pzAsoixOehG21tOwbqHzNUNR8enqasbtJ11aP118P7svKRL35mMYn0fMujAFFYtUxc4kyXh
DLycgbWAvZ1/WDszaycY7vzU2/nY27n6lcZl/BvDgVr2zTXaSx8sH7qvOwG778SLKIJXRMIT5ClY
gQ+29dLUmH+XgG48Zt96lr3StZUmN3AShhkjFmhn765cNM0BWCl4SROnGE+bVYfnz4HHOeiGl9CL
xO8lhPpLlsTjLE8JrRKGvpPpyPy2atjJ8FWR2hrlo3iUtqAFAC1FPrRGtm1bI/vwR2zLWACtrDMa
dUaj0agz6UPW0Tujkd6ZtMxy6tzjEc2dBGCdxigOK1848ARSTDPvQQiqpT1CmKTQDsEFpw8hvHLh
/F0fwr09Ez7fxHt7t+CCEcIe2LDSBudv4VHj4IKtLe94xKDN4RXExBB4BYf48PmG38JrF5zui+L1
FTgvuybwvT1ttgaNpPrg0sg+RCymETyEto+A3RekoXNwwVfdDqw0FmUMxCic7eURzoYQ3e5RCQEW
Tq3gumtw3W4Jd2TX4LrdIwV3uA53ZJdwx3W4I1vBHcFKS6bg0utrsAWj9uj1lQuxRtyfCu4nU+ye
wivs7sMUZfCoBYIzsAfTW2JKIJgCT08QiJV3TaBJbEGjIGQOu3ByBHsQIAu6L7QVQYtJiDpXyKvt
z3ER9hGhxLfXLhwfd1+e0AKx8/jHw6Mj0yymWUN0VCI6OT4+PEFMiAgcxzlyHKcO+iyZFgzD4YeF
WPuwvJndCoYDLUa+RyzWFjczoY/+vI9cFK0rLUfEfcjAhZlSrExxO4c9WN5kyINbZPnMeyDLZVl9
7HOx8xaltEA0ul5KJOuTLGaFJIjexY0UA765cHhkggDFX300Gul6RVNoDMmnNmZUH/PahcNuwWyn
+2N1fCYMRlvf8fV98OdmDVTyeyPAaLTYsY8eqlDEdEtw/aT/HaASVmjCHho8nLADjt09Mvfh+OSw
a8MeItwRbbDSVsre6SN9Jxvp+j5i11YtNE4s8uYZC8g0SUvkFQ7js6sbXbRI4SL2KXDN29k+AIT7
8HUfZgiEa87g2f9C55836J4aP9bGx2H52Nv42CmcnOVo2TziNHG4D50ba9j79eC2Y2pfwYXwxrlF
O9iHGb116Y2ImqFmdVGvvqJezVCvHLQ1EnH78OQYduGrZONX6MCRCVbx4ti2We0rX9vO8SHs4gwW
HGJj14QOHONTeHN4a8IuvDg5sm16P7qFXTg8kW/H+HYink9utZWm/PADuJC3PbMP3+jps9kXvhna
D/AKbNy83+AVPJjwF7ChR4R8AwsbhCQzPom9mXDDZeigOabwhFdn73+6/oQRQ7dsOTsfYsth2fI/
12fUdFQZ9OED9PvaSdly+tdLGvRj2fTX6ytseVG2vPs0wJaXZcvPEpNjl23XV5cUxjgVOq8G7/9G
bd3auC61VWj9dEZTaE6F2NMPlx9p3HHZNhxQm4ahEnJqxnIPEx1iVZ5MXaPtL9IIrDC7AmsGXbB+
gU/XQ7B+gtYvlrfMLOZ3LQVm5cmUxVaeR1bG/CQOsh6c2Bg4YILWoTQw73hz3qGBugnPn2vNCX4C
fRvmHhh5MtUb+HCMRemZ4ejaqhoKYcgoMrYxDyryf+Q86FkrDCC5VYaNtgobMUF0ca/wwDXaigio
pH9mH/I7Fkt8PChQISS+K0wh127AipFmHuhwi+pKY9oYH1kxtJys889Rm5MR8KzwdndkGp2R05m3
BBBlqnp1WWYdJUpOpZsLEerqRpnA6MDjMIFKgNh9/dyh6HTp8XwsQYk9sWtr+BpBibAPQaLFrtFu
x7AHjomz60asgzVhoBuNRBeX+Px5EYgXY9m/wBFdmLfofhLnHo9ZqiaCOMnBi7MlS3k86QOSxuMJ
LOaQJ2A8NqZZZTrG9eBoQRIzjZKDbM58ER1Twt2uM6GcUY4EywqTdOZhZBzOcl3Et1U2o6yKhWDE
3XpqFUF3JuLrRYZPfhIw/J8kM9mBqSc+hjLhxGdOvwyTTHj1anDxTjPQ3+CD0COFiaN1hycgi6/+
r7/Qj4mqtmsqKlyrSH6I94IoHU1numBC/0SbG3pRxrSSXLcZ7pddehnP/3PUxnkt1FMQz70Detmz
bduG6+EbVN/hqPtrp2VqFRZswq/6/vwEBecU03kMVFjYhSdotUyoLvAbS5OCPQVkIaMNoBXi42Rp
FsDKZFCoEGeLlI35zJuIbdTYftheaB1pWWMzVnaMrcWuA4HrqI1YxzVHEIECk+IgqW/GWhmpuRVp
4xGCJEQfGHo8YgG05XgwYrMPMXvIkQ/GY6D2mG4Ees0AAHKjHcAudKU1CJCAHA5tW8wZuIe2XWxN
/96j9BLYvReBXlWCkT4q60aGMza6PWs10kWS7QdcpKU8hJsKI4piRWFXhDVWma3Ie/siJK+2dfyO
0UZqBAvPTz8OMJ8POVIZJZ70Edw1HPAxZnDXhoM/5XFQa//57PytCT6JudZBVRBT82fZpNb+8eq9
CX66iGutqjpigp9hR8BFhymI86fEQqEUs6noFavCzprlQsUAFJ19YB/jS8yQoYu4QJPO1hAQy3+A
7I5FkX/H/CkEPPM+R8y9etN1ujb8ADzPwEsnC1G79ZMZE+Xg/I6V9rWVoU3HcZlGG4+YKjKdHqls
db+AbgjO6WiZSEVFu2wGngnXcO/xCKnpQ55+Rc+QJ2Ke+OvS+6prQrcyhnYdDOSujnrjk6+tbyIE
swKwLBQxbh9vxtD8/xcyUTf8rJMu4gOWpnrh5nndeonSlM8Lu4WO3Ji3zNIuhFwTcp+kbA4HUMML
T5B7PEIwtPP+IgfLdywMpSnsKGwFkVYlgtxIzeihC+IxLipGtjzB3FsgSei7iP88nmwIcViausaj
8kc9y5hlk5X2IJxI4YkeyFNILwIPpSWtGNyHipGsWEytMDwhx0U9q8UUtKJq/FFxtl0NlYnHC4ag
SGhVfiQ+Ybt6gFTrJORWSxFvOZJscnBVosn8PzRtekmoMlgeEramtjyE5Zou4UilCtXYQa6wR5ms
lqYuud+lK6wwQSUxKnkg19IH2nSk2dXtpLim4p2tPBNcLlUHSapFqVV10b6vLnKuQgwqR/h3qoeM
YZUGSm9FaqnaaruJh+sKJOqaS7IdS9dyCgKXf1AFSMlKnpNc7j0ZFnxmYZIysn5kL8FPFhE2UzCo
16iUkt4uJqVjUgC1smvNsAhLhI9aT74s5uUzGbgbsJiwLFmezCUL6wqKHWDlZSvV9fVilnokUotr
ZizLVEgjpeXTfrutrMjWQhcJyFk64zGd4lmo4zPvwTXqRwfCjz8DK8OQW1J7U2B14Z0XRZ89fzpM
PiST7CKm85hymBCuDlbMwFbNgixKhKRSCHqiZGKhjW0EY1EyycCiHnhhV3gd6iIUe3qCnninyGbm
PYjYhkqONCeuDN9kblddjDDqvoKjjico6tyyHXmb5HcszarRzZJHETJBqOxtbetS0IHblsc8N7cx
g+gWHp3FAY8nOib3M4/HpvbFdSDystx1pE1DHF90sCK2ObK6LaLLL2ISZFVFZipy+SIDICQdp1Ij
ngnVVHHMF93soOpLDESK9gXjyC8yq6SNIeWJ3fq2RRXWKOS4rD+0nsCtUqRYv2mFkv5AUS3lUXTU
+Uw74kaB4N6sBd+2oLW52sLxrDQtY3kesapCkNCRrRkPmO/JjfAI65u+nLtBVR9WMjRG7RLWUMW7
bCZ9XJn0V6olAmeRWji2ZGCtEFDJwNeKHCKUkwiBB7CIp3GyjKF99vHtFR38F9UNCHhQKQCYupbx
iav4UGj6JKejhHV7EOXgnNhFGoDARluW/cBot8VAcbJgmiZxQARn0sSZFGBLGWizJGUyOxbblHY9
NpJpj3jMXP1xpIsjy5HeG5Wuw2IPPB/p+yP9fqT3nP1RwYOzYKT3jLY6b5PMMveNxlmtLicw8N9+
BXUTnDIU3dxHQsi/vUkWcY6j5Hu2FdU6LT7RMtKZPF7HfsG2/ZGeJDNxvi5ak2TWxJypw/Ym3sL1
EvawOH5fH1eUAswmctTdS7EkBMNXXLRwrrJD0Jam0monKavUPNDg1DAKsV4KFzzSezhOLyISPtE3
AZFCRSRuHDPSxVzKbm+bCx1aEoZXoiKKVDrFVJQLbICh6KfJokb1ROYR1dwBWScxSz8tdwq9PXOh
peutTfPJbYAz4tAq/1cY3/hJGrj0qvCv3SYoDB6N1Y1HHL0zWq32RzpVb5vLWcdgrnRNZLbWHPSi
LqCuQex0dle6ltm0t7+xBooPF+91U7vH3uppORXx7m3XrtxZoWSkGXMJwnV4/Xodr7T9onLpxWSp
5nMWB1SbbI7WWLTZpRfSkNrZaN50YwSH1S6NKD8kZ7i3hV3UjcwunRQRSlwAwQUw7m3MpOdellN6
gbQn4Rrt0DYyGz5/zVlm9jDYjdg+GWZVjg2TFHguDgRLjn5HIFSDlONqpFIhshBJyGWIvz0SUoEv
+WNtCx+bUi2nLqKIoglnFCURwTA0fbQvekCqTnFankSiKlR1EN+lk7RLGBjZQrLj8UT7o9TVl1yS
i+GCJ040gMoL1r/eiSLSugjqdSGElNSIaym/Q4Tf2VO/X22Vktd1wS47SJMpeCuHNJQEiV/MWXrP
MyZl4gW07qrZ8DO0WMIBYrRHBX5MmJRT3FDjl6NtmVCWQ+u90pS7jq1UoBxZWU4t96PbNzInl3ec
hOe2jHZbgWNoYprKzlSob4xAHaiWJKhG2cCqICinbbUgTWUWLKokEHq5F7mtllDUKq0qf6IBG45o
6lEa2YKNBzNk//5EDes3ihIipPSCZE6mSA2uZO2ikNfva7smNDL6Oy8AL8J8/SvgRmcBKSgZQ6VU
SQrFecd/ouLxx8swslsUpFAZf1M2VJRFPYUlz++okL9BQmp1ZMZJlavZfcPgNjJ7XfPvZkkA9snJ
CWweEHJR+ZUr/guu1DaFlVVMImFBGwNPU/9PLrRr/puQQSXvTGdghVAWYkoe0lwlE6meRW3lRvyz
dcqQa5RCuVqt7IEmBt0B6M0If0RDRjpd+xOgTnEES+4OYwCfl1sjZfOENkCRVVvfQDcIdttUciKU
JyU+27KRfZ3OJTZaN8onxUmFppW5arX80TM23nZF3ZIJcm/X3JwcE0KKz/t9KqH0ztk9S83idXdr
TaUGOvN43DuNlt7XzNzQcxG/83i0SNnvwybPaGtaUwwSy28EGmWKUXG81XvHa1616p/YNpha2Cgh
IOIznsMmAEiZ59+xQDgAkYVWZRZycYV1Tb6qcllkp9vX1pbXr2oZZDNNpDWdqDPHpnMmvirFlZUB
jObUueCMCvcSSpwCbonZiyJOxVJWC46N0yVlGjaUV4vCiKggo+kRXzzQLiTDuX171OSDTkPwXpzW
ynWsMlBQUAjf1LeXlOQSYteu1NFiUVMpudMoiq1VmSgUmYNTLw+pwtCmclmVreSFxEmzmhA5oQRq
tNvysXLiXFBWO3dWINXT5z93pLnx4rpGTrpaD1+/9d6sjm85CLCrhzUygiPsW49sVMCz4SyvWfFH
6Vdxfve+wSbt/R4w7e/6Ce4mLjROc9eH/MmT3Y2C0bXvnfDWVkPHvLUlKeUsD2efxFbD2PBTErQy
iFm+TNJpJdZUkQMxuweVY94msq0nvZRfopcay90ojgMC5gVUfzHabaNNHxjs7WQm7NU+zMBcIElh
TrtfwYtjStd4nO/s9HZXMMdo+3H+w25vpXIlXp4gkYPUIhbmdJ1DTgsWVGaVuw0HCZvQleUjhOrK
c/EixVo7BaWb1fIuXemZy/L4Whwz5VEElg26MW/gqvoopBxT2MKMSUvYnqSez8B4RPJWaPe2nYWJ
Bf1uI02AhYmWZ75IYXmcx7z5+C7J8g0XVjanxvMksJYpz3MW18ywvOGhLh3quTfJii/POsbmr4Zq
i6iX7tfJoE+XfstuF+fUGKs/xquM3H3uTWAbCaruJYqoZRJflZz6Dgw3v0wboj7ME3HtD9DGJ7HP
KC0TBaw7LwNVRaDKlarS7IMnalniHqhwgxuXSheZXBuxu5K9/y/+CKdUr4jIuEW6pGYZA11Tyryp
YG3Jpapv3QZcZV+x+IIlXphj5ksCatdLfkkY7ovBLA6gQGnK6l0DIam5RFokQVvY2ZzpMQnDnhUn
MVttmRF9RjHp71CC786+iCOWFaCooCFPs1zdVtsszmbpRNyGq8zZQ4LLjyv1rYGD/eIEfgAPg4WZ
FwdSGekuPiQxzBfpPBGxew2hlGOeenOwYPDL2VAj7tPZYEmNhctXqNXVkJRJ18hjOLHlvbyTMsYh
pK1ConRxNmYPGFywIPqq96GwTy0xtYwvfC9ixXd0dvEt3cHtrgniA9fyOqmsjTXv+2JM0/jY9cRW
lbTGhcSnJ6h/6XpcrdzJ79UK8ysq7X7K0BvJXq24RECnVkkcNraIhKJruqK/tM3I6ZpUs2SR+swt
L4wfKKSS/i2m4elp+/egdch6plXC1b8WrcNUj61LiOo3mvXx8kZHOVR9utkgRdzCqFFR+aZTq3w0
6BrFJ8Od5rnTWoFZfBLYgV4LWuPxuGV+775mlNM9cHFi/a24R+DIy5J6ra95MlqXNAkKIs+fZus8
2qfIvojXMkhSWDtorSlGGaKICE5Zpm0eTJVM1Dh1TSi/45kIC/Wy8l+bacPly9pXCyqDLCJJvXhZ
zItnveN3drG33rCYi68X8pSz7Hsn+zRA+Jtj6esEjNFu08P6IT9GAPdkm+vf/xJwcyN37pNoMWNZ
x7in+pOsGv7444+bRogJtuZqzkv4QZRIIfemDDOHStqWhKKO66d8noskTVNFocxttehiCj3w2n0R
/r37Ir+Z8ZYRtTJJMr6t3xjZeIOnXRxkEAaqREmCTa3eB881iuOflSvSDd7D8LOM/PUirlFELFTx
69l3g+riorAjq2+VIidHVeDVoPA/yL5KcWLDNaI1rq7xSIhYN+g/GM/0zSugpEl8ryOGEgsqEb1k
Qy0v07TKLaTCLqxZjPWgrXK8JpKkxkCzPEglM0H1H2Up/i8AAP//6+1Y84ZDAAA=
REAPER_EOF
chmod 0755 "$root/usr/local/bin/reaper-wrapper"

# The Pod and the launch's exit token, for the wrapper, and the containers'
# environment: root only (0600).
umask 077
cat >"$root/etc/reaper/workload.conf" <<'REAPER_EOF'
# Reaper workload for Pod batch/provision-8fj2k, read by /usr/local/bin/reaper-wrapper.
# shellcheck shell=sh disable=SC2034,SC1003,SC2016
REAPER_POD_NAMESPACE='batch'
REAPER_POD_NAME='provision-8fj2k'
REAPER_POD_UID='7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d'
REAPER_RESTART_POLICY='Never'
REAPER_MAX_RESTARTS=0
REAPER_SHUTDOWN_MODE='when-shipped'
REAPER_POD_WRITTEN_TAG=''
REAPER_SHUTDOWN_DELAY=600
REAPER_EXIT_LOG='/var/log/reaper/exit.log'
REAPER_CLI='docker'
REAPER_POD_JSON='"podNamespace":"batch","podName":"provision-8fj2k","podUID":"7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"'
REAPER_EXIT_TOKEN='9c0d6b1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012345678'
REAPER_GRACE=30
REAPER_MSG_MAX=4096
REAPER_VOLUMES='work'
# The container whose network the Pod's containers share.
REAPER_PAUSE_IMAGE='registry.k8s.io/pause:3.10'
REAPER_PAUSE_RUN_ARGS='--label reaper.io/pod-namespace=batch --label reaper.io/pod-name=provision-8fj2k --label reaper.io/pod-uid=7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d registry.k8s.io/pause:3.10'
REAPER_CONTAINERS=2
# initContainers[0]: init. Arguments of "run -d --name NAME", as shell words.
REAPER_C1_NAME='downloader'
REAPER_C1_KIND=init
REAPER_C1_IMAGE='registry.example.com/tools/fetch:2.1'
REAPER_C1_MSG='File'
REAPER_C1_RUN_ARGS='--label reaper.io/pod-namespace=batch --label reaper.io/pod-name=provision-8fj2k --label reaper.io/pod-uid=7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d --label reaper.io/container=downloader --env-file /etc/reaper/env/downloader -v "$state"'\''/volumes/work:/work'\'' -v "$cs"'\''/termination-log:/dev/termination-log'\'' --network container:reaper-pause --entrypoint /bin/fetch registry.example.com/tools/fetch:2.1 --to /work s3://bucket/bundle.tgz'
# containers[0]: main. Arguments of "run -d --name NAME", as shell words.
REAPER_C2_NAME='provisioner'
REAPER_C2_KIND=main
REAPER_C2_IMAGE='registry.example.com/tools/provision:3.0'
REAPER_C2_MSG='File'
REAPER_C2_RUN_ARGS='--label reaper.io/pod-namespace=batch --label reaper.io/pod-name=provision-8fj2k --label reaper.io/pod-uid=7a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d --label reaper.io/container=provisioner --env-file /etc/reaper/env/provisioner -v "$state"'\''/volumes/work:/work:ro'\'' -v "$cs"'\''/termination-log:/dev/termination-log'\'' --network container:reaper-pause registry.example.com/tools/provision:3.0 --bundle /work/bundle.tgz'
REAPER_EOF
mkdir -p "$root/etc/reaper/env"
cat >"$root/etc/reaper/env/downloader" <<'REAPER_EOF'
AWS_REGION=eu-west-1
REAPER_EOF
cat >"$root/etc/reaper/env/provisioner" <<'REAPER_EOF'
MODE=full
REAPER_EOF
umask 022

cat >"$root/etc/systemd/system/reaper-workload.service" <<'REAPER_EOF'
[Unit]
Description=Reaper workload supervisor (runs the Pod's container, reports its exits)
Wants=network-online.target docker.service
After=network-online.target docker.service amazon-cloudwatch-agent.service

[Service]
Type=simple
Environment=HOME=/root
ExecStart=/usr/local/bin/reaper-wrapper /etc/reaper/workload.conf
Restart=on-failure
RestartSec=5
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
REAPER_EOF

cat >"$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json" <<'REAPER_EOF'
{
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {
            "file_path": "/var/log/reaper/exit.log",
            "log_group_name": "/reaper/prod-eu-1/exits",
            "log_stream_name": "{instance_id}"
          }
        ]
      }
    },
    "force_flush_interval": 1
  }
}
REAPER_EOF
touch "$root/var/log/reaper/exit.log"
chmod 0644 "$root/var/log/reaper/exit.log"

# live-restore keeps the container running while dockerd restarts. Merge it
# into an existing daemon.json rather than replace the file.
live_restore() {
	local f=$root/etc/docker/daemon.json
	mkdir -p "$root/etc/docker" || return 1
	if [ ! -s "$f" ]; then
		echo '{"live-restore": true}' >"$f" || return 1
	elif command -v jq >/dev/null 2>&1; then
		jq '."live-restore" = true' "$f" >"$f.reaper" || return 1
		mv "$f.reaper" "$f" || return 1
	elif command -v python3 >/dev/null 2>&1; then
		python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["live-restore"] = True
json.dump(c, open(sys.argv[1] + ".reaper", "w"), indent=2)' "$f" || return 1
		mv "$f.reaper" "$f" || return 1
	else
		echo "reaper user-data: no jq or python3 to merge live-restore into $f" >&2
		return 1
	fi
	systemctl try-reload-or-restart docker.service
}
live_restore || echo "reaper user-data: live-restore not configured; a dockerd restart will stop the workload" >&2

# Ship the exit log. The agent comes with the AMI, or from the distribution.
ctl=$(command -v amazon-cloudwatch-agent-ctl || echo /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl)
if [ ! -x "$ctl" ]; then
	if command -v dnf >/dev/null 2>&1; then dnf install -y amazon-cloudwatch-agent; else yum install -y amazon-cloudwatch-agent; fi
fi
"$ctl" -a append-config -m ec2 -s -c "file:$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json"

systemctl daemon-reload
systemctl enable reaper-workload.service
systemctl start --no-block reaper-workload.service
